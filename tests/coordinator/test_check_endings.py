"""Every way a back-check request can end leaves each of its transactions decided or scheduled.

Issue 13: no transaction is ever stranded. For each ending (verdicts, a partial answer, a
batch refused with 400, error statuses, timeouts, connection refused, garbage, a vanished
target, checks that cannot be asked, a revoked partition) the tests assert what a user sees:
what a read_committed consumer of the real topic receives (each COMMIT exactly once, no
ROLLBACK), the coordinator's counters, and that nothing stays pending.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import main
from coordinator.config import Secrets
from servers.broker import free_port
from tests.coordinator.check_server import CheckServer, Misbehaviour
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, RunningCoordinator, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic
from txbridge.wire import CheckRequest, TxState, half_partition, new_tx_id

pytestmark = pytest.mark.integration

COMMIT, ROLLBACK = TxState.COMMIT, TxState.ROLLBACK


# ------------------------------------------------------------------ what the user sees


def _live(env: Env) -> list[RunningCoordinator]:
    return [h for h in env.running if h.thread.is_alive()]


def _pending(env: Env) -> int:
    return sum(len(s.pending) for h in _live(env) for s in h.service.partitions.values())


def _stat(env: Env, name: str) -> int:
    return sum(h.service.stats[name] for h in env.running)


def _published(env: Env, topic: str, isolation: str = "read_committed") -> Counter[str]:
    """How many records of each transaction ``topic`` shows (its messages carry ``txb.tx``)."""
    return Counter(
        s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic, isolation=isolation)
    )


def _settled(env: Env, topic: str, commits: set[str], timeout: float = 60.0) -> Counter[str]:
    """Wait until every COMMIT is visible and nothing is pending; returns what ``topic`` shows then."""
    eventually(lambda: set(_published(env, topic)) >= commits, timeout)
    assert eventually(lambda: _pending(env) == 0, timeout), f"{_pending(env)} transactions still pending"
    return _published(env, topic)


def _expired(env: Env) -> set[str]:
    return {s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, env.topics.expired)}


def _unknown_halves(env: Env, topic: str, count: int, *, check_after: float = 0.5) -> list[str]:
    """``count`` one-message transactions without a decision, due for their first check at once."""
    tx_ids = [
        env.producer.halves(
            [Msg(topic, f"m{i}".encode(), key=f"k{i}".encode())], check_after=check_after, flush=False
        )[0]
        for i in range(count)
    ]
    env.producer.flush()
    return tx_ids


def _answer_from(truth: dict[str, TxState]) -> Callable[[CheckRequest], TxState]:
    return lambda req: truth.get(req.tx_id, TxState.UNKNOWN)


def _split(tx_ids: Sequence[str], rollback_every: int = 3) -> dict[str, TxState]:
    """Every ``rollback_every``-th transaction is rolled back, the others committed."""
    return {tx: ROLLBACK if i % rollback_every == 0 else COMMIT for i, tx in enumerate(tx_ids)}


def _commits(truth: dict[str, TxState]) -> set[str]:
    return {tx for tx, state in truth.items() if state is COMMIT}


def _assert_outcome(env: Env, topic: str, truth: dict[str, TxState], timeout: float = 60.0) -> None:
    """COMMITs visible exactly once, ROLLBACKs never written at all, nothing pending, nothing expired."""
    commits = _commits(truth)
    assert _settled(env, topic, commits, timeout) == Counter(dict.fromkeys(commits, 1))
    uncommitted = _published(env, topic, isolation="read_uncommitted")
    assert not set(uncommitted) & (set(truth) - commits)
    assert _stat(env, "resolved_expired") == 0


# ------------------------------------------------------------------ 1. verdicts


def test_a_batch_answer_publishes_each_commit_once_and_no_rollback(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    truth = _split(_unknown_halves(env, topic, 12))
    check_server.script = _answer_from(truth)
    env.start()

    _assert_outcome(env, topic, truth)
    assert max(check_server.batch_sizes) > 1
    assert Counter(c.tx_id for c in check_server.calls) == Counter(dict.fromkeys(truth, 1))
    assert _stat(env, "resolved_rolled_back") == len(truth) - len(_commits(truth))


# ------------------------------------------------------------------ 2. a partial answer


def test_a_partial_batch_answer_decides_the_named_and_rechecks_the_others(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    tx_ids = _unknown_halves(env, topic, 9)
    truth = _split(tx_ids)
    late = set(tx_ids[:4])  # left out of the first answer that asks about them
    asked: set[str] = set()
    lock = threading.Lock()

    def script(req: CheckRequest) -> TxState | None:
        with lock:
            first = req.tx_id not in asked
            asked.add(req.tx_id)
        return None if first and req.tx_id in late else truth[req.tx_id]

    check_server.script = script
    env.start(max_checks=5)

    _assert_outcome(env, topic, truth)
    assert max(check_server.batch_sizes) > 1
    asks = Counter(c.tx_id for c in check_server.calls)
    assert {tx: asks[tx] for tx in late} == dict.fromkeys(late, 2)
    assert {tx: asks[tx] for tx in set(tx_ids) - late} == dict.fromkeys(set(tx_ids) - late, 1)


# ------------------------------------------------------------------ 3. a batch refused with 400


def _key_on(partition: int, prefix: str) -> bytes:
    """An order key whose transactions go to half partition ``partition``."""
    for i in range(1000):
        key = f"{prefix}-{i}".encode()
        if half_partition(key, PARTITIONS) == partition:
            return key
    raise AssertionError(f"no key on partition {partition}")


#: The user's mix, each step a name; the checked transactions' halves are "checked".
_MIX = ["checked", "rolled_back", "conflict", "op_right_behind", "bad_half", "bad_op"]


@pytest.mark.parametrize(
    "order",
    [
        _MIX,
        ["bad_half", "bad_op", "op_right_behind", "conflict", "rolled_back", "checked"],
        [
            "rolled_back",
            "op_right_behind",
            "checked",
            "conflict",
            "bad_op",
            "bad_half",
        ],  # malformed half last
        ["op_right_behind", "checked", "bad_half", "rolled_back", "bad_op", "conflict"],
        *[random.Random(seed).sample(_MIX, len(_MIX)) for seed in (1, 2)],
    ],
    ids="-".join,
)
def test_a_producer_without_batches_gets_every_transaction_decided_among_the_users_mix(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], order: list[str]
) -> None:
    """The user's report: a kafka-python producer answers batches with 400; 3 runs in 12 lost
    the one transaction answered COMMIT. Its mix: rolled-back and conflicting transactions, an op
    read before its half, malformed records in the half and op topics (on the checked one's partition)."""
    topic = topic_factory(partitions=3)
    check_server.batches = False
    env.producer.heartbeat(check_server.url)
    home = 1  # the half partition of the transaction answered COMMIT
    truth: dict[str, TxState] = {}
    check_server.script = _answer_from(truth)
    handle = env.start()

    def checked() -> None:  # several due at once: a batch, refused with 400
        keys = [_key_on(home, "checked"), _key_on(0, "a"), _key_on(2, "b"), _key_on(home, "c")]
        verdicts = [COMMIT, ROLLBACK, ROLLBACK, ROLLBACK]
        tx_ids = [new_tx_id() for _ in keys]
        truth.update(zip(tx_ids, verdicts, strict=True))  # before the halves: the check may come at once
        for tx_id, key in zip(tx_ids, keys, strict=True):
            env.producer.halves([Msg(topic, b"checked", key=key)], tx_id=tx_id, check_after=0.5, flush=False)
        env.producer.flush()

    def rolled_back() -> None:
        truth[env.producer.transaction([Msg(topic, b"rolled back", key=_key_on(home, "r"))], ROLLBACK)] = (
            ROLLBACK
        )

    def conflict() -> None:
        tx_id, partition = env.producer.halves([Msg(topic, b"conflict", key=_key_on(home, "x"))])
        env.producer.op(tx_id, partition, COMMIT, count=1)
        env.producer.op(tx_id, partition, ROLLBACK)  # ignored: the first decision is final
        truth[tx_id] = COMMIT

    def op_right_behind() -> None:
        # The op written the moment its half is acknowledged, so the coordinator may read it first.
        # (An op written before its half is a writer's error, docs/wire-format.md: its COMMIT is
        # given up when the half partition's end is reached without it, which is timing, so no
        # test can assert it here; tests/coordinator/test_state.py covers that rule.)
        tx_id, messages = new_tx_id(), [Msg(topic, b"op right behind", key=_key_on(home, "o"))]
        env.producer.halves(messages, tx_id=tx_id)
        env.producer.op(tx_id, env.producer.partition_of(tx_id, messages), COMMIT, count=1)
        truth[tx_id] = COMMIT

    def bad_half() -> None:
        env.producer.raw(env.topics.half, home, b"garbage", b"a record without txbridge headers")

    def bad_op() -> None:
        env.producer.raw(env.topics.op, home, b"garbage", b"not json")

    steps = {f.__name__: f for f in (checked, rolled_back, conflict, op_right_behind, bad_half, bad_op)}
    for name in order:
        steps[name]()

    _assert_outcome(env, topic, truth)
    assert check_server.rejected >= 1  # the batch was refused, then single checks answered
    assert handle.service.stats["conflicting_ops"] == 1
    assert handle.service.stats["quarantined_records"] == 2


# ------------------------------------------------------------------ 4. error statuses


def _verdicts(checks: Sequence[CheckRequest], state: str, **extra: object) -> bytes:
    """A well-formed answer's shape (single or batch, as asked) with ``state`` and ``extra`` keys."""
    if len(checks) == 1:
        return json.dumps({"state": state, **extra}).encode()
    return json.dumps({"states": {c.tx_id: state for c in checks}, **extra}).encode()


# 400 is the one status the checker reads apart (a batch refused: asked again one by one); the
# others are all "not an answer", and tests/unit/test_wire.py holds every status to it.
@pytest.mark.parametrize("status", [400, 403, 503])
def test_error_statuses_for_the_first_requests_then_verdicts_decide_everything(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], status: int
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    truth = _split(_unknown_halves(env, topic, 4), rollback_every=2)
    check_server.script = _answer_from(truth)
    failed: list[int] = []

    def first_asked(number: int, checks: Sequence[CheckRequest]) -> Misbehaviour | None:
        # A request that asks about a transaction for the first time fails, whichever request it
        # is: the halves may be read, and so first asked about, in one batch or several. A
        # transaction is in at most four such requests (one per transaction), below max_checks.
        if not any(len(check_server.calls_for(c.tx_id)) == 1 for c in checks):
            return None
        failed.append(number)
        return Misbehaviour(status=status, body=_verdicts(checks, "COMMIT"))

    check_server.misbehave = first_asked
    env.start(max_checks=5)

    _assert_outcome(env, topic, truth)
    assert failed
    assert check_server.requests > len(failed)
    assert all(len(check_server.calls_for(tx)) >= 2 for tx in truth)  # each was in a failed request


# ------------------------------------------------------------------ 5. timeouts and slow answers


def test_a_timed_out_request_is_asked_again_and_decided(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    truth = _split(_unknown_halves(env, topic, 4), rollback_every=2)
    check_server.script = _answer_from(truth)
    check_server.misbehave = lambda number, _checks: Misbehaviour(delay_s=2.5) if number == 1 else None
    env.start(check_timeout_s=1.0, max_checks=5)

    _assert_outcome(env, topic, truth)
    timed_out = check_server.calls[: check_server.batch_sizes[0]]  # the first request's transactions
    assert all(len(check_server.calls_for(c.tx_id)) >= 2 for c in timed_out)


def test_slow_answers_just_under_the_timeout_decide_at_the_first_ask(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    truth = _split(_unknown_halves(env, topic, 4), rollback_every=2)
    check_server.script = _answer_from(truth)
    check_server.misbehave = lambda _number, _checks: Misbehaviour(delay_s=1.3)
    env.start(check_timeout_s=2.0)

    _assert_outcome(env, topic, truth)
    assert Counter(c.tx_id for c in check_server.calls) == Counter(dict.fromkeys(truth, 1))


# ------------------------------------------------------------------ 6. connection refused


@pytest.mark.parametrize("who", ["another-instance", "the-writer-restarted"])
def test_connection_refused_until_a_live_instance_with_a_working_url_registers(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], who: str
) -> None:
    topic = topic_factory()
    env.producer.heartbeat(f"http://127.0.0.1:{free_port()}/txbridge/check")  # nothing listens there
    check_server.script = lambda _req: COMMIT
    handle = env.start(max_checks=30)
    tx_id = env.producer.transaction([Msg(topic, b"v", key=b"k")], TxState.UNKNOWN)
    assert eventually(lambda: handle.service.stats["checks"] >= 2)  # refused at least twice

    env.producer.heartbeat(check_server.url, instance="inst-2" if who == "another-instance" else "inst-1")

    _assert_outcome(env, topic, {tx_id: COMMIT})
    assert check_server.calls_for(tx_id)


# ------------------------------------------------------------------ 7. garbage bodies


def _other_shape(checks: Sequence[CheckRequest]) -> bytes:
    """A COMMIT in the shape of the other kind of request: a batch answer to a single check and back."""
    if len(checks) == 1:
        return json.dumps({"states": {checks[0].tx_id: "COMMIT"}}).encode()
    return b'{"state": "COMMIT"}'


_GARBAGE: dict[str, Callable[[Sequence[CheckRequest]], bytes]] = {
    "not-json": lambda _c: b"<html>502 Bad Gateway</html>",
    "empty": lambda _c: b"",
    "a-list": lambda _c: b'["COMMIT"]',
    "states-not-a-dict": lambda _c: b'{"states": ["COMMIT"]}',
    "extra-key": lambda checks: _verdicts(checks, "COMMIT", ok=True),
    "lowercase": lambda checks: _verdicts(checks, "commit"),
    "other-shape": _other_shape,
}


@pytest.mark.parametrize(
    ("batch_size", "garbage"),
    [(25, name) for name in _GARBAGE]
    + [(1, "not-json"), (1, "extra-key"), (1, "lowercase"), (1, "other-shape")],
    ids=lambda value: f"batch{value}" if isinstance(value, int) else value,
)
def test_a_garbage_answer_is_unknown_and_the_transaction_is_decided_when_answered(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], batch_size: int, garbage: str
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    truth = _split(_unknown_halves(env, topic, 4), rollback_every=2)
    check_server.script = _answer_from(truth)
    body = _GARBAGE[garbage]
    check_server.misbehave = lambda _number, checks: (
        Misbehaviour(status=200, body=body(checks))
        if all(c.attempt <= 2 for c in checks)  # the first two asks about each get garbage
        else None
    )
    env.start(max_checks=6, check_batch_size=batch_size)

    _assert_outcome(env, topic, truth)  # no ROLLBACK one published: garbage never reads as COMMIT
    assert all(len(check_server.calls_for(tx)) >= 3 for tx in truth)


# ------------------------------------------------------------------ 8. a vanished target


def test_the_writer_leaves_between_checks_and_another_instance_decides(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    writer = CheckServer(SECRET.encode()).start()  # UNKNOWN: its local transaction is not done
    env.producer.heartbeat(writer.url, instance="inst-1")
    check_server.script = lambda _req: COMMIT
    env.start(max_checks=30)
    tx_id = env.producer.transaction([Msg(topic, b"v", key=b"k")], TxState.UNKNOWN)
    assert eventually(lambda: writer.calls_for(tx_id))

    env.producer.leave(instance="inst-1")  # the writer is gone ...
    writer.stop()
    asked_before = len(writer.calls_for(tx_id))
    env.producer.heartbeat(check_server.url, instance="inst-2")  # ... another instance is live

    _assert_outcome(env, topic, {tx_id: COMMIT})
    assert check_server.calls_for(tx_id)[0].instance == "inst-1"  # asked about the writer's tx
    assert len(writer.calls_for(tx_id)) == asked_before


def test_the_writer_leaves_while_its_check_is_in_flight_and_another_live_instance_decides(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    writer = CheckServer(SECRET.encode(), misbehave=lambda _n, _c: Misbehaviour(delay_s=3.0)).start()
    env.producer.heartbeat(writer.url, instance="inst-1")
    check_server.script = lambda _req: COMMIT
    try:
        env.start(max_checks=30, check_timeout_s=1.5)
        tx_id = env.producer.transaction([Msg(topic, b"v", key=b"k")], TxState.UNKNOWN)
        assert eventually(lambda: writer.calls_for(tx_id))
        env.producer.leave(instance="inst-1")  # gone while the coordinator waits for its answer
        env.producer.heartbeat(check_server.url, instance="inst-2")

        _assert_outcome(env, topic, {tx_id: COMMIT})
        assert check_server.calls_for(tx_id)
    finally:
        writer.stop()


# ------------------------------------------------------------------ 9. checks that cannot be asked

#: How a transaction cannot be asked about: the coordinator's settings, and what heartbeat registers.
_UNASKABLE = ["host-not-allowed", "no-secret", "no-live-instance", "connection-refused"]


def _unaskable_config(cause: str) -> dict[str, Any]:
    if cause == "host-not-allowed":
        return {"allowed_check_hosts": ("localhost",)}  # the check URL names 127.0.0.1
    if cause == "no-secret":
        return {"secrets": Secrets(by_group={"payments": "another-secret"})}
    return {}


@pytest.mark.parametrize("cause", _UNASKABLE)
def test_a_check_that_cannot_be_asked_never_expires_the_transaction_and_is_decided_once_fixed(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    cause: str,
) -> None:
    """A refused host, a group without a secret, a group without a live instance, a live instance
    whose URL refuses the connection: no request reached a producer, so none is an answer. They
    do not count toward max_checks, are logged once per group and URL (at ERROR; a refused
    connection, which a restarting group shows for a moment, at WARNING), counted
    (``checks_not_asked``) and shown by ``txbridge admin pending``."""
    topic = topic_factory()
    check_server.script = lambda _req: COMMIT
    if cause == "connection-refused":
        env.producer.heartbeat(f"http://127.0.0.1:{free_port()}/txbridge/check")  # nothing listens there
    elif cause != "no-live-instance":
        env.producer.heartbeat(check_server.url)
    caplog.set_level(logging.WARNING)
    policy: dict[str, Any] = {
        "max_checks": 2,
        "check_delay_s": 0.3,
        "check_backoff_s": 0.2,
        "check_backoff_max_s": 0.3,
    }
    first = env.start(**policy, **_unaskable_config(cause))
    tx_ids = {
        env.producer.transaction([Msg(topic, f"v{i}".encode(), key=f"k{i}".encode())], TxState.UNKNOWN)
        for i in range(2)
    }
    time.sleep(6.0)  # about ten times the whole check schedule (0.3 + 0.2 + 0.3 s)

    assert first.service.stats["resolved_expired"] == 0
    assert _expired(env) == set()
    assert first.service.stats["checks_not_asked"] > 0
    assert _pending(env) == len(tx_ids)
    assert check_server.calls == []
    ours = [r for r in caplog.records if r.name.startswith("coordinator")]
    errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
    if cause == "connection-refused":
        warned = [r.getMessage() for r in ours if "gave no answer (ConnectError" in r.getMessage()]
        assert (len(warned), errors) == (1, []), (warned, errors)  # once per group and URL, not per check
    else:
        assert len(errors) == 1, errors  # once per group and URL, not per check
    assert SECRET not in caplog.text
    listed = CliRunner().invoke(
        main,
        [
            "admin",
            "pending",
            "--bootstrap",
            env.bootstrap,
            "--namespace",
            env.namespace,
            "--group-id",
            env.config().group_id,
        ],
    )
    assert listed.exit_code == 0, listed.output
    lines = [line for line in listed.output.splitlines() if any(tx in line for tx in tx_ids)]
    assert len(lines) == len(tx_ids), listed.output
    assert all("not asked" in line for line in lines), listed.output

    if cause in ("no-live-instance", "connection-refused"):
        env.producer.heartbeat(check_server.url)  # the group's instance is up (again)
    else:  # the operator fixes the setting and restarts the coordinator
        first.stop()
        env.start(**policy)

    _assert_outcome(env, topic, dict.fromkeys(tx_ids, COMMIT))
    assert _expired(env) == set()


# ------------------------------------------------------------------ 10. the partition moves


@pytest.mark.parametrize("move", ["a-second-coordinator-joins", "the-first-coordinator-stops"])
def test_a_verdict_arriving_after_its_partition_moved_is_neither_lost_nor_applied_twice(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], move: str
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    # One transaction per half partition, so whichever partitions move, one of them is in flight.
    tx_ids = [
        env.producer.halves([Msg(topic, f"m{p}".encode(), key=_key_on(p, "moved"))], check_after=0.5)[0]
        for p in range(PARTITIONS)
    ]
    truth = {tx: COMMIT for tx in tx_ids} | {tx_ids[0]: ROLLBACK}
    moved = threading.Event()

    def script(req: CheckRequest) -> TxState:
        moved.wait(20)  # the answers in flight arrive once the partitions moved (within the timeout)
        return truth[req.tx_id]

    check_server.script = script
    policy: dict[str, Any] = {"check_timeout_s": 30.0, "max_checks": 10}
    first = env.start(**policy)
    assert eventually(lambda: check_server.requests >= 1)  # the checks of all three are in flight

    if move == "a-second-coordinator-joins":
        second = env.start(wait=False, **policy)
        assert eventually(lambda: second.service.partitions, timeout=60)  # the first's were revoked
        moved.set()
    else:
        first.service.stop()
        assert eventually(lambda: not first.service.partitions, timeout=60)  # released, checks in flight
        moved.set()
        first.stop()
        env.start(**policy)

    _assert_outcome(env, topic, truth)
    assert check_server.requests >= 2  # the new owner asked again about what it took over
    assert _stat(env, "resolved_rolled_back") >= 1
