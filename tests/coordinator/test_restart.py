"""A clean stop with pending transactions; the next coordinator restores them from <ns>_state."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from coordinator.commit.changelog import decode_entry
from coordinator.group.clients import REJOIN_WINDOW_S
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.errors import KafkaOperationError
from txbridge.wire import TxState, is_owner_key, is_positions_key


def _live_state(env: Env) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    for s in read_topic(env.bootstrap, env.topics.state):
        # where each partition stands and who owns it: no transaction
        if is_positions_key(s.key) or is_owner_key(s.key):
            continue
        latest[s.key] = s.value
    return {k: v for k, v in latest.items() if v is not None}


pytestmark = pytest.mark.integration


def test_pending_transactions_survive_a_restart(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    env.producer.heartbeat(check_server.url)  # UNKNOWN for now
    first = env.start(max_checks=50)
    by_check = env.producer.transaction([Msg(topic, b"by-check", key=b"a")], TxState.UNKNOWN)
    by_op, by_op_partition = env.producer.halves([Msg(topic, b"by-op-0", key=b"b"), Msg(topic, b"by-op-1")])
    assert eventually(lambda: len(check_server.calls_for(by_check)) >= 2)
    first.stop()

    pending = _live_state(env)
    assert {by_check.encode(), by_op.encode()} <= set(pending)
    checks_before = decode_entry(pending[by_check.encode()]).checks
    assert checks_before >= 2
    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []

    calls_before = len(check_server.calls_for(by_check))
    check_server.script = lambda req: TxState.COMMIT if req.tx_id == by_check else TxState.UNKNOWN
    second = env.start(max_checks=50)
    env.producer.op(by_op, by_op_partition, TxState.COMMIT, count=2)

    seen = wait_for(env.bootstrap, topic, 3)
    assert sorted(s.value for s in seen) == [b"by-check", b"by-op-0", b"by-op-1"]
    assert [s.value for s in seen if s.headers["txb.tx"] == by_op.encode()] == [b"by-op-0", b"by-op-1"]
    attempts = [c.attempt for c in check_server.calls_for(by_check)[calls_before:]]
    assert attempts[0] == checks_before + 1  # the check count was restored, not restarted
    assert eventually(lambda: not ({by_check.encode(), by_op.encode()} & set(_live_state(env))))
    assert second.service.stats["resolved_published"] == 2


def test_two_coordinators_with_one_instance_id_publish_once_and_one_stops(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """A misconfiguration: two coordinators share an instance id. As static members they fence
    each other's membership over and over; each claim fences the other's partitions, so
    nothing is published twice meanwhile, and one of them stops with an error that names the
    instance id while the other serves."""
    topic = topic_factory()
    first = env.start(instance_id="same")
    second = env.start(instance_id="same", wait=False)
    sent: list[str] = []
    # The rule stops a coordinator whose clients failed REJOINS_MAX times in REJOIN_WINDOW_S;
    # each failure is a fence and a rejoin, which on a slow box took past 120 s for all of them.
    deadline = time.monotonic() + REJOIN_WINDOW_S
    while first.thread.is_alive() and second.thread.is_alive() and time.monotonic() < deadline:
        sent.append(env.producer.transaction([Msg(topic, f"m{len(sent)}".encode())], TxState.COMMIT))
        first.thread.join(0.5)
    stopped, serving = (first, second) if not first.thread.is_alive() else (second, first)
    assert not stopped.thread.is_alive(), "neither coordinator stopped"
    assert [type(e) for e in stopped.errors] == [KafkaOperationError]
    assert "with instance id same?" in str(stopped.errors[0])
    sent.append(env.producer.transaction([Msg(topic, b"after")], TxState.COMMIT))
    wait_for(env.bootstrap, topic, len(sent), timeout=60)
    time.sleep(2)
    seen = read_topic(env.bootstrap, topic)
    assert sorted(s.headers["txb.tx"] for s in seen) == sorted(t.encode() for t in sent)
    assert serving.thread.is_alive()


@pytest.mark.parametrize(
    ("budget", "with_entries"),
    [(1000, False), (12, True)],  # 12 characters: room for one or two, the others get entries
    ids=["all-in-offset-metadata", "budget-overflows-to-state"],
)
def test_young_transactions_survive_a_restart(
    env: Env, topic_factory: Callable[..., str], budget: int, with_entries: bool
) -> None:
    topic = topic_factory()
    first = env.start(check_delay_s=60.0, offset_metadata_bytes=budget)
    young = [
        env.producer.halves(
            [Msg(topic, f"y{i}-0".encode(), key=b"k"), Msg(topic, f"y{i}-1".encode(), key=b"k")]
        )
        for i in range(5)
    ]
    assert eventually(lambda: sum(len(s.pending) for s in first.service.partitions.values()) == 5)
    first.stop()
    entries = {decode_entry(v).tx_id for v in _live_state(env).values() if v is not None}
    assert entries < {tx for tx, _ in young} if with_entries else entries == set()
    assert bool(entries) is with_entries

    second = env.start(check_delay_s=60.0, offset_metadata_bytes=budget)
    for tx, partition in young:
        env.producer.op(tx, partition, TxState.COMMIT, count=2)
    seen = wait_for(env.bootstrap, topic, 10)
    # One key: republished once each, in the order their halves were written.
    assert [s.value for s in seen] == [f"y{i}-{j}".encode() for i in range(5) for j in range(2)]
    assert second.service.stats["resolved_published"] == 5
    assert eventually(lambda: not _live_state(env))  # the entries were tombstoned
    time.sleep(1)
    assert len(read_topic(env.bootstrap, topic)) == 10
