"""The commit cycle (coordinator/commit/cycle.py) without a broker.

Kafka is a fake implementing :class:`CommitKafka`: transactional producers that record what each
transaction carried and whose commits can be held, failed or stuck. The partition states, the
transaction content and the cycle's threads are the real ones. On a real broker the same cycle runs
in tests/coordinator (test_commit_rollback.py, test_rejoin.py, test_writer_faults.py, ...).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from coordinator.commit.cycle import THREAD_PREFIX, CommitCycle
from coordinator.commit.writer import TransactionWriter
from coordinator.config import CoordinatorConfig
from coordinator.failures import Failures
from coordinator.monitoring.metrics import Stat
from coordinator.monitoring.watchdog import Watchdog, WedgedCalls
from coordinator.state.owned import OwnedPartitions, Work
from coordinator.state.partition import PartitionState, PendingTx, Phase
from coordinator.state.republisher import Batch
from txbridge.errors import KafkaOperationError
from txbridge.kafka import KafkaError, KafkaException, TopicPartition
from txbridge.wire import HalfMessage, OpRecord, OpSource, Topics, TxState

TOPICS = Topics("ns")


class FakeProducer:
    """A transactional producer: each transaction's records, its end, and faults to inject."""

    def __init__(self) -> None:
        self.open: list[str] | None = None  # the tx ids republished in the open transaction
        self.committed: list[list[str]] = []
        self.aborted: list[list[str]] = []
        self.hold: threading.Event | None = None  # commit_transaction waits for it
        self.faults: list[Exception] = []  # raised by the next commit_transaction calls
        self.commit_calls = 0
        self.reported: list[bool] = []  # per republished record: whether it asked for its delivery report

    def begin_transaction(self) -> None:
        assert self.open is None, "a transaction began while the previous one was open"
        self.open = []

    def produce(  # noqa: PLR0917 (confluent_kafka.Producer.produce's signature)
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        assert self.open is not None, "produced outside a transaction"
        tx = dict(headers or ()).get("txb.tx")
        if topic == "orders" and tx is not None:
            self.open.append(tx.decode() if isinstance(tx, bytes) else tx)
            self.reported.append(on_delivery is not None)

    def poll(self, _timeout: float) -> int:
        return 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None, 1: None})})

    def commit_transaction(self, timeout: float) -> None:
        self.commit_calls += 1
        if self.hold is not None:
            self.hold.wait(10)
        if self.faults:
            raise self.faults.pop(0)
        assert self.open is not None
        self.committed.append(self.open)
        self.open = None

    def abort_transaction(self, timeout: float) -> None:
        assert self.open is not None
        self.aborted.append(self.open)
        self.open = None


class FakeKafka:
    """:class:`CommitKafka`: the coordinator's one fake producer (every partition's), end offsets
    from a dict."""

    def __init__(self, numbers: list[int]) -> None:
        self.the_producer = FakeProducer()
        self.producers = dict.fromkeys(numbers, self.the_producer)
        self.writers = dict.fromkeys(numbers, TransactionWriter(cast(Any, self.the_producer)))
        self.abandoned: list[int] = []
        self.copied: list[list[TopicPartition]] = []
        self.ends: dict[int, int] = {}

    def writer(self, number: int) -> TransactionWriter:
        return self.writers[number]

    def producer(self, number: int) -> FakeProducer:
        return self.producers[number]

    def abandon(self, number: int) -> None:
        self.abandoned.append(number)

    def half_end(self, number: int, timeout: float) -> int:
        return self.ends[number]

    def renew_end_offsets(self) -> None:
        pass

    def copy_to_group(self, offsets: list[TopicPartition]) -> None:
        self.copied.append(offsets)


class FakeReader:
    def load(self, _txs: list[PendingTx]) -> None:
        pass


class Parts:
    def __init__(self, numbers: tuple[int, ...] = (0,), *, pace_ms: int = 0) -> None:
        self.stats: Counter[str] = Counter()
        self.owned = OwnedPartitions(TOPICS)
        self.owned.install({n: PartitionState(n, self.stats) for n in numbers})
        self.partitions = self.owned.states
        self.positions = self.owned.positions
        self.work = self.owned.work
        self.kafka = FakeKafka(list(numbers))
        self.failures = Failures()
        self.rewound: list[list[int]] = []
        self.watchdog = Watchdog(lambda _wedged: None)
        self.cycle = CommitCycle(
            CoordinatorConfig(bootstrap="b:1", commit_pace_ms=pace_ms),
            self.owned,
            stats=self.stats,
            failures=self.failures,
            watchdog=self.watchdog,
            kafka_side=self.kafka,
            reader=FakeReader(),
            wedged=WedgedCalls("i", lambda: None, abandonable=THREAD_PREFIX, hook=None),
            rewind=self.rewound.append,
        )
        self._offsets = dict.fromkeys(numbers, 0)

    def half(self, tx: str, number: int = 0) -> PartitionState:
        """A transaction's half record, consumed; returns its partition's state."""
        state = self.partitions[number]
        offset = self._offsets[number]
        half = HalfMessage(tx, 0, "orders", b"v", key=b"k", group="g", instance="i")
        state.on_half(half, offset, 10, int(time.time() * 1000))
        self._offsets[number] = offset + 1
        self.owned.place(TOPICS.half, number, offset + 1)
        return state

    def commit_tx(self, tx: str, number: int = 0) -> None:
        """A transaction's half and its producer's COMMIT, consumed."""
        done = self.half(tx, number).on_op(OpRecord(tx, TxState.COMMIT, OpSource.PRODUCER, count=1))
        assert done is not None
        assert done.phase is Phase.READY
        self.work.ready.add(number)
        self.work.unsaved.add(number)

    def expire_tx(self, tx: str, number: int = 0) -> None:
        """A transaction's half with no decision, its back-checks exhausted: it goes to <ns>_expired."""
        self.work.expiring[tx] = self.half(tx, number).pending[tx]

    def until(self, done: Callable[[], bool]) -> None:
        """Collect until ``done`` (the loop's part)."""
        give_up = time.monotonic() + 10
        while not done():
            assert time.monotonic() < give_up, "the cycle never got there"
            self.cycle.collect()
            time.sleep(0.005)


@pytest.fixture
def parts() -> Any:
    made = Parts()
    yield made
    made.cycle.close()


def kafka_error(code: int, **kinds: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "injected", **kinds))


def test_a_ready_transaction_commits_at_once_and_its_positions_are_copied(parts: Parts) -> None:
    parts.commit_tx("t1")
    assert parts.cycle.waiting() == {0}

    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)

    assert parts.kafka.producers[0].committed == [["t1"]]
    assert parts.partitions[0].pending == {}
    assert parts.stats[Stat.KAFKA_TRANSACTIONS] == 1
    assert parts.stats[Stat.MESSAGES_REPUBLISHED] == 1
    assert parts.work.ready == set()
    assert parts.work.unsaved == set()
    assert parts.kafka.copied == [[TopicPartition(TOPICS.half, 0, 1)]]


def test_an_expiry_is_in_flight_until_the_transaction_carrying_it_ended(parts: Parts) -> None:
    # The service looks for returning producer groups only when none is: the expiry resumer's
    # listing of <ns>_expired must find it (coordinator/service.py, _look_around).
    producer = parts.kafka.producers[0]
    producer.hold = threading.Event()
    parts.commit_tx("t1")
    parts.cycle.start(everything=True)
    assert parts.cycle.in_flight
    assert not parts.cycle.expiries_in_flight(), "a commit without expiries holds nothing back"
    producer.hold.set()
    parts.until(lambda: not parts.cycle.in_flight)

    producer.hold = threading.Event()
    parts.expire_tx("t2")
    parts.cycle.start(everything=True)
    assert parts.cycle.expiries_in_flight()
    assert parts.stats[Stat.RESOLVED_EXPIRED] == 1  # counted at the fill, before the commit
    producer.hold.set()
    parts.until(lambda: not parts.cycle.in_flight)
    assert not parts.cycle.expiries_in_flight()

    parts.commit_tx("t3")  # the partition's next transaction carries no expiry
    producer.hold = threading.Event()
    parts.cycle.start(everything=True)
    assert not parts.cycle.expiries_in_flight()
    producer.hold.set()
    parts.until(lambda: not parts.cycle.in_flight)


def test_what_becomes_ready_during_a_commit_goes_into_the_next(parts: Parts) -> None:
    producer = parts.kafka.producers[0]
    producer.hold = threading.Event()
    parts.commit_tx("t1")
    parts.cycle.start(everything=False)
    assert parts.cycle.behind_in_flight() == set(), "nothing waits for the lone commit to end"
    parts.commit_tx("t2")
    parts.commit_tx("t3")

    assert parts.cycle.behind_in_flight() == {0}, "the loop must look for the commit's end"
    assert parts.cycle.waiting() == set(), "a second commit of the partition while one is in flight"
    parts.cycle.start(everything=True)
    parts.cycle.collect()
    assert producer.committed == []
    assert list(parts.cycle.in_flight) == [0]

    producer.hold.set()
    parts.until(lambda: not parts.cycle.in_flight)
    assert parts.cycle.waiting() == {0}
    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)

    assert producer.committed == [["t1"], ["t2", "t3"]]
    assert parts.stats[Stat.KAFKA_TRANSACTIONS] == 2


def test_the_partitions_ready_share_one_transaction_and_the_others_wait_for_the_next() -> None:
    parts = Parts((0, 1, 2))
    producer = parts.kafka.the_producer
    try:
        producer.hold = threading.Event()
        parts.commit_tx("a1", 0)
        parts.commit_tx("b1", 1)
        parts.cycle.start(everything=False)
        assert sorted(parts.cycle.in_flight) == [0, 1]
        parts.commit_tx("c1", 2)
        parts.commit_tx("a2", 0)
        assert parts.cycle.waiting() == set(), "a second transaction while one is in flight"
        assert parts.cycle.behind_in_flight() == {0, 2}
        parts.cycle.start(everything=True)
        assert sorted(parts.cycle.in_flight) == [0, 1]
        producer.hold.set()
        parts.until(lambda: not parts.cycle.in_flight)
        parts.cycle.start(everything=False)
        parts.until(lambda: not parts.cycle.in_flight)
        assert producer.committed == [["a1", "b1"], ["a2", "c1"]]
        assert parts.stats[Stat.KAFKA_TRANSACTIONS] == 2
    finally:
        parts.cycle.close()


def test_an_abortable_failure_rewinds_every_partition_of_the_transaction() -> None:
    parts = Parts((0, 1))
    producer = parts.kafka.the_producer
    try:
        producer.faults.append(kafka_error(KafkaError._STATE, txn_requires_abort=True))
        parts.commit_tx("a1", 0)
        parts.commit_tx("b1", 1)
        parts.cycle.start(everything=False)
        parts.until(lambda: not parts.cycle.in_flight)
        assert producer.committed == []
        assert producer.aborted == [["a1", "b1"]]
        assert parts.rewound == [[0, 1]]
        assert parts.stats[Stat.KAFKA_ABORTS] == 1
    finally:
        parts.cycle.close()


def test_records_report_their_delivery_only_after_an_abort_until_a_commit(parts: Parts) -> None:
    # A delivery report is a GIL round trip on the commit thread per record: only the retry of a
    # failed transaction needs them, to find a record the broker refused.
    producer = parts.kafka.producers[0]
    for tx, fault in (("t1", False), ("t2", True), ("t3", False), ("t4", False)):
        if fault:
            producer.faults.append(kafka_error(KafkaError._STATE, txn_requires_abort=True))
        parts.commit_tx(tx)
        parts.cycle.start(everything=False)
        parts.until(lambda: not parts.cycle.in_flight)

    assert producer.aborted == [["t2"]]
    assert producer.committed == [["t1"], ["t3"], ["t4"]]
    assert producer.reported == [False, False, True, False]


def test_an_abortable_failure_aborts_and_rewinds_the_partition(parts: Parts) -> None:
    producer = parts.kafka.producers[0]
    producer.faults.append(kafka_error(KafkaError._STATE, txn_requires_abort=True))
    parts.commit_tx("t1")
    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)

    assert producer.committed == []
    assert producer.aborted == [["t1"]]
    assert parts.rewound == [[0]]
    assert parts.stats[Stat.KAFKA_ABORTS] == 1
    assert parts.failures.clients is None
    assert parts.work.unsaved == set()


def test_a_retriable_commit_failure_is_resumed(parts: Parts) -> None:
    producer = parts.kafka.producers[0]
    producer.faults.append(kafka_error(KafkaError._TIMED_OUT, retriable=True))
    parts.commit_tx("t1")
    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)

    assert producer.committed == [["t1"]]
    assert producer.commit_calls == 2
    assert parts.stats[Stat.COMMIT_RETRIES] == 1
    assert parts.rewound == []


@pytest.mark.parametrize(
    ("fault", "counter"),
    [
        (kafka_error(KafkaError.PRODUCER_FENCED), Stat.PARTITIONS_FENCED),
        (kafka_error(KafkaError._FATAL, fatal=True), Stat.PRODUCER_FATAL_ERRORS),
    ],
)
def test_a_fenced_or_fatal_commit_asks_for_new_clients_without_rewinding(
    parts: Parts, fault: Exception, counter: str
) -> None:
    producer = parts.kafka.producers[0]
    producer.faults.append(fault)
    parts.commit_tx("t1")
    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)

    assert isinstance(parts.failures.clients, KafkaOperationError)
    assert parts.stats[counter] == 1
    assert producer.aborted == []
    assert parts.rewound == []


def test_a_stuck_commit_is_abandoned_with_the_producer() -> None:
    parts = Parts((0, 1))
    try:
        stuck = parts.kafka.the_producer
        stuck.hold = threading.Event()
        parts.commit_tx("a1", 0)
        parts.commit_tx("b1", 1)
        parts.cycle.start(everything=False)
        parts.until(lambda: stuck.commit_calls == 1)
        # The watchdog's report names the commit thread the call is stuck on.
        thread = next(t.name for t in threading.enumerate() if t.name.startswith("txbridge-commit"))
        assert parts.cycle.wedged(thread)
        assert not parts.cycle.wedged("txbridge-fence_0")
        parts.cycle.collect()

        assert parts.kafka.abandoned == [0]
        assert parts.stats[Stat.COMMITS_WEDGED] == 1
        assert parts.failures.clients is not None
        assert parts.failures.clients.fatal
        assert parts.cycle.in_flight == {}
        stuck.hold.set()
    finally:
        parts.cycle.close()


def test_the_commit_after_an_abandoned_one_is_not_taken_for_stuck_before_its_thread_runs(
    parts: Parts,
) -> None:
    stuck = parts.kafka.producers[0]
    stuck.hold = threading.Event()
    parts.commit_tx("t1")
    parts.cycle.start(everything=False)
    parts.until(lambda: stuck.commit_calls == 1)
    thread = next(t.name for t in threading.enumerate() if t.name.startswith("txbridge-commit"))
    assert parts.cycle.wedged(thread)
    parts.cycle.collect()
    assert parts.kafka.abandoned == [0]
    # New clients: a new producer; the stuck thread stays stuck. The next commit's thread has
    # not run yet when the loop collects.
    parts.kafka.the_producer = fresh = FakeProducer()
    parts.kafka.producers[0] = fresh
    parts.kafka.writers[0] = TransactionWriter(cast(Any, fresh))
    go = threading.Event()
    end = parts.cycle._end
    parts.cycle._end = lambda *args: (go.wait(10), end(*args))[1]  # type: ignore[method-assign]
    parts.commit_tx("t2")
    parts.cycle.start(everything=False)
    parts.cycle.collect()
    go.set()
    parts.until(lambda: not parts.cycle.in_flight)

    assert parts.kafka.abandoned == [0]
    assert fresh.committed == [["t2"]]
    stuck.hold.set()


def test_nothing_starts_once_the_coordinator_must_stop(parts: Parts) -> None:
    parts.failures.fatal = KafkaOperationError("stop", fatal=True)
    parts.commit_tx("t1")
    parts.cycle.start(everything=True)
    assert parts.cycle.in_flight == {}
    assert parts.kafka.producers[0].open is None


def test_the_work_of_dropped_partitions_is_forgotten() -> None:
    work = Work(Batch(TOPICS))
    work.ready |= {0, 1}
    work.unsaved |= {0, 1}
    work.keep_only({1})
    assert (work.ready, work.unsaved, work.busy()) == ({1}, {1}, {1})


def test_with_a_pace_a_busy_partition_waits_and_a_lone_transaction_does_not() -> None:
    parts = Parts(pace_ms=20)
    now = [100.0]
    parts.cycle.clock = lambda: now[0]
    try:
        parts.commit_tx("t1")
        parts.cycle.start(everything=False)  # alone: no pace after it
        parts.until(lambda: not parts.cycle.in_flight)
        parts.commit_tx("t2")
        parts.commit_tx("t3")
        assert parts.cycle.waiting() == {0}
        parts.cycle.start(everything=False)  # two: the partition's next commit waits for the pace
        parts.until(lambda: not parts.cycle.in_flight)
        parts.commit_tx("t4")

        assert parts.cycle.waiting() == set()
        assert parts.cycle.pace_wait() == pytest.approx(0.020)
        parts.cycle.start(everything=False)
        assert not parts.cycle.in_flight
        parts.cycle.start(everything=True)  # the interval's tick waits for the pace as well
        assert not parts.cycle.in_flight
        now[0] += 0.020
        assert parts.cycle.waiting() == {0}
        parts.cycle.start(everything=False)
        parts.until(lambda: not parts.cycle.in_flight)
        assert parts.kafka.producers[0].committed == [["t1"], ["t2", "t3"], ["t4"]]
        assert parts.cycle.waiting() == set()
        assert parts.cycle.pace_wait() == 0.0
    finally:
        parts.cycle.close()


def test_without_a_pace_a_busy_partition_commits_again_at_once(parts: Parts) -> None:
    parts.commit_tx("t1")
    parts.commit_tx("t2")
    parts.cycle.start(everything=False)
    parts.until(lambda: not parts.cycle.in_flight)
    parts.commit_tx("t3")

    assert parts.cycle.waiting() == {0}
    assert parts.cycle.pace_wait() == 0.0
