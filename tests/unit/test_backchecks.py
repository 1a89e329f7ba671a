"""The coordinator's back-check planning and answers (coordinator/checks/backchecks.py), without a broker.

The checker, registry and half re-reader are fakes; the partition states, the batch of op
records and the check policy are the real ones. The same code runs against real producers in
tests/coordinator/test_backcheck.py, test_check_endings.py and test_gone_writer.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from coordinator.checks.backchecks import BackChecks
from coordinator.checks.checker import CheckJob, CheckResult
from coordinator.config import CoordinatorConfig
from coordinator.state.partition import PartitionState, PendingTx, Phase
from coordinator.state.republisher import Batch
from coordinator.state.scheduler import CheckPolicy
from txbridge.wire import HalfMessage, OpSource, Topics, TxState, decode_op

NOW_MS = 1_000_000_000
DELAY_S = 6.0


class FakeChecker:
    def __init__(self, slots: int = 10) -> None:
        self.in_flight_txs: set[str] = set()
        self.slots = slots
        self.sent: list[list[CheckJob]] = []
        self.answers: list[CheckResult] = []

    def free_slots(self, _group: str) -> int:
        return self.slots

    def submit_batch(self, jobs: list[CheckJob]) -> bool:
        self.sent.append(jobs)
        return True

    def results(self) -> list[CheckResult]:
        answers, self.answers = self.answers, []
        return answers


class FakeView:
    def __init__(self) -> None:
        self.urls = {("g", "i1"): "http://i1", ("g", "i2"): "http://i2"}
        self.gone: set[tuple[str, str]] = set()
        self.left: set[tuple[str, str]] = set()
        self.liveness_ms = 2_000  # shorter than DELAY_S: what is due before it was expedited

    def targets(self, group: str, instance: str, _source: str | None, _now_ms: int) -> list[str]:
        own = [self.urls[(group, instance)]] if (group, instance) in self.urls else []
        return own + [url for (g, i), url in sorted(self.urls.items()) if g == group and i != instance]

    def instances_of(self, group: str, _now_ms: int) -> tuple[tuple[str, str | None, str], ...]:
        return tuple((i, None, url) for (g, i), url in sorted(self.urls.items()) if g == group)

    def silent(self, _now_ms: int) -> set[tuple[str, str]]:
        return set(self.gone)

    def decisive_elsewhere(self, group: str, instance: str, _now_ms: int) -> bool:
        return any(g == group and i != instance and (g, i) not in self.gone for g, i in self.urls)


class FakeRegistry:
    def __init__(self) -> None:
        self.caught_up = True
        self.view = FakeView()


class FakeReader:
    def load(self, _txs: list[PendingTx]) -> None:
        pass


def half(tx: str, seq: int = 0, instance: str = "i1") -> HalfMessage:
    return HalfMessage(tx, seq, "orders", b"v", key=b"k", group="g", instance=instance)


class Parts:
    def __init__(self, *, batch_size: int = 200, slots: int = 10) -> None:
        self.config = CoordinatorConfig(bootstrap="b:1", check_batch_size=batch_size, check_invariants=True)
        self.stats: Counter[str] = Counter()
        self.partitions = {0: PartitionState(0), 1: PartitionState(1)}
        self.batch = Batch(Topics("ns"))
        self.ready: set[int] = set()
        self.expiring: dict[str, PendingTx] = {}
        self.checker = FakeChecker(slots)
        self.registry = FakeRegistry()
        self.now = NOW_MS
        self.checks = BackChecks(
            self.config,
            CheckPolicy(delay_s=DELAY_S, max_checks=2, backoff_s=1.0, backoff_max_s=4.0),
            self.stats,
            self.partitions,
            batch=self.batch,
            ready=self.ready,
            expiring=self.expiring,
            checker=cast(Any, self.checker),
            registry=cast(Any, self.registry),
            reader=cast(Any, FakeReader()),
            now_ms=lambda: self.now,
        )

    def open_tx(self, tx: str, partition: int = 0, instance: str = "i1") -> PendingTx:
        state = self.partitions[partition]
        state.on_half(half(tx, instance=instance), len(state.pending), 10, self.now - int(DELAY_S * 1000) - 1)
        return state.pending[tx]

    def answer(self, tx: PendingTx, state: TxState, *, asked: bool = True) -> None:
        job = next(job for jobs in self.checker.sent for job in jobs if job.request.tx_id == tx.tx_id)
        self.checker.answers.append(CheckResult(job, state, "http://i1", asked=asked))
        self.checks.apply_results()


def test_due_transactions_go_in_one_request_per_writer_up_to_the_batch_size() -> None:
    parts = Parts(batch_size=2)
    for n in range(3):
        parts.open_tx(f"a{n}", partition=n % 2)
    parts.open_tx("b0", instance="i2")

    parts.checks.schedule([0, 1])

    requests = [[job.request.tx_id for job in jobs] for jobs in parts.checker.sent]
    assert sorted(map(sorted, requests)) == [["a0", "a2"], ["a1"], ["b0"]]
    first = next(jobs for jobs in parts.checker.sent if jobs[0].request.instance == "i1")
    assert first[0].targets == ("http://i1", "http://i2")  # the writer first, then the group
    assert first[0].request.attempt == 1
    assert parts.stats["checks"] == 4
    assert parts.stats["check_requests"] == 3


def test_a_partition_whose_ops_are_not_read_up_is_not_asked_about() -> None:
    parts = Parts()
    parts.open_tx("a", partition=0)
    parts.open_tx("b", partition=1)

    parts.checks.schedule([1])  # partition 0's producer decisions may still be unread

    assert [job.request.tx_id for jobs in parts.checker.sent for job in jobs] == ["b"]


def test_no_free_request_slot_leaves_the_checks_for_a_later_pass() -> None:
    parts = Parts(slots=0)
    parts.open_tx("a")

    parts.checks.schedule([0])

    assert parts.checker.sent == []
    assert parts.stats["checks"] == 0


def test_a_commit_verdict_decides_the_transaction_and_writes_its_op() -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    parts.checks.schedule([0])

    parts.answer(tx, TxState.COMMIT)

    # A verdict carries no half count: it waits until its half partition is read to the end.
    assert tx.phase is Phase.COMMITTED
    assert parts.ready == set()
    [record] = [r for r in parts.batch.records_of(0) if r.topic == "ns_op"]
    op = decode_op(record.value)
    assert (op.tx_id, op.state, op.source) == ("a", TxState.COMMIT, OpSource.CHECK)
    assert parts.stats["check_verdicts"] == 1


def test_unknown_answers_use_up_the_checks_and_then_the_transaction_expires() -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    for _ in range(2):  # max_checks
        parts.checks.schedule([0])
        parts.answer(tx, TxState.UNKNOWN)
        parts.now += 10_000  # past the backoff
        parts.checker.sent.clear()

    assert tx.phase is Phase.OPEN
    assert parts.expiring == {"a": tx}
    assert parts.batch.partitions() == set()


def test_a_request_that_reached_no_producer_does_not_use_up_a_check() -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    parts.checks.schedule([0])

    parts.answer(tx, TxState.UNKNOWN, asked=False)

    assert tx.checks == 0
    assert parts.expiring == {}
    assert parts.stats["checks_not_asked"] == 1


def test_an_answer_for_a_transaction_decided_meanwhile_changes_nothing() -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    parts.checks.schedule([0])
    tx.move(Phase.ROLLED_BACK)  # the producer's own op arrived first

    parts.answer(tx, TxState.COMMIT)

    assert parts.ready == set()
    assert parts.batch.partitions() == set()


def test_a_gone_writers_transactions_are_due_at_once_when_another_instance_is_decisive() -> None:
    parts = Parts()
    parts.now = NOW_MS
    state = parts.partitions[0]
    state.on_half(half("young"), 0, 10, parts.now)  # not due for another DELAY_S
    parts.checks.schedule([0])
    assert parts.checker.sent == []

    parts.registry.view.gone = {("g", "i1")}
    parts.checks.expedite_gone_writers()
    parts.checks.schedule([0])

    assert [job.request.tx_id for jobs in parts.checker.sent for job in jobs] == ["young"]
    assert parts.stats["checks_expedited"] == 1


def sent_ids(parts: Parts) -> list[str]:
    return [job.request.tx_id for jobs in parts.checker.sent for job in jobs]


def test_a_gone_writers_transaction_that_arrives_after_it_was_found_gone_is_due_at_once_too() -> None:
    # The writer was found gone before its last transaction's half was read: one look, which
    # found nothing to expedite, must not be the only one (test_gone_writer.py's race).
    parts = Parts()
    parts.now = NOW_MS
    parts.registry.view.gone = {("g", "i1")}
    parts.checks.expedite_gone_writers()
    assert parts.stats["checks_expedited"] == 0

    parts.partitions[1].on_half(half("late"), 0, 10, parts.now)  # not due for another DELAY_S
    parts.checks.expedite_gone_writers()
    parts.checks.schedule([0, 1])

    assert sent_ids(parts) == ["late"]
    assert parts.stats["checks_expedited"] == 1


def test_expediting_again_as_transactions_arrive_skips_only_the_first_delay_never_the_backoff() -> None:
    parts = Parts()
    parts.now = NOW_MS
    parts.partitions[0].on_half(half("first"), 0, 10, parts.now)
    parts.registry.view.gone = {("g", "i1")}
    parts.checks.expedite_gone_writers()
    parts.checks.schedule([0])
    first = parts.partitions[0].pending["first"]
    parts.answer(first, TxState.UNKNOWN)
    backoff = first.next_check_ms
    assert backoff is not None
    assert backoff > parts.now

    parts.partitions[0].on_half(half("second"), 1, 10, parts.now)
    parts.checker.sent.clear()
    parts.checks.expedite_gone_writers()
    parts.checks.schedule([0])

    assert sent_ids(parts) == ["second"]
    assert first.next_check_ms == backoff
    assert parts.stats["checks_expedited"] == 2


def test_a_writer_that_left_has_late_transactions_expedited_for_a_liveness_period_only() -> None:
    parts = Parts()
    parts.now = NOW_MS
    view = parts.registry.view
    view.left = {("g", "i1")}
    parts.checks.expedite_gone_writers()  # found: it left (nothing of it pending yet)

    parts.partitions[0].on_half(half("soon"), 0, 10, parts.now)
    parts.now += view.liveness_ms
    parts.checks.expedite_gone_writers()
    parts.partitions[0].on_half(half("later"), 1, 10, parts.now)
    parts.now += 1
    parts.checks.expedite_gone_writers()  # past its liveness period: forgotten
    parts.checks.schedule([0])

    assert sent_ids(parts) == ["soon"]


def test_checks_wait_for_the_registry_at_most_a_while() -> None:
    parts = Parts()
    parts.registry.caught_up = False
    assert not parts.checks.registry_read()
    parts.checks._started -= 60  # long after start: checks go ahead without it
    assert parts.checks.registry_read()


@pytest.mark.parametrize("verdict", [TxState.COMMIT, TxState.ROLLBACK])
def test_a_verdict_counts_as_a_check(verdict: TxState) -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    parts.checks.schedule([0])
    parts.answer(tx, verdict)
    assert tx.checks == 1
    assert tx.phase is (Phase.COMMITTED if verdict is TxState.COMMIT else Phase.ROLLED_BACK)


def test_running_answers_never_use_up_the_checks_and_are_asked_again_later() -> None:
    parts = Parts()
    tx = parts.open_tx("a")
    for _ in range(10):  # five times max_checks
        parts.checks.schedule([0])
        parts.answer(tx, TxState.RUNNING)
        assert tx.next_check_ms == parts.now + 4_000  # backoff_max_s
        parts.now += 4_000
        parts.checker.sent.clear()

    assert tx.checks == 0
    assert tx.phase is Phase.OPEN
    assert parts.expiring == {}
    assert parts.stats["checks_running"] == 10
    # Once the instance stops answering RUNNING, UNKNOWN uses up the checks as before.
    for _ in range(2):
        parts.checks.schedule([0])
        parts.answer(tx, TxState.UNKNOWN)
        parts.now += 10_000
        parts.checker.sent.clear()
    assert parts.expiring == {"a": tx}
