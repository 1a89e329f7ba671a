"""UNKNOWN outcomes resolved by signed back-checks over HTTP, on the real broker."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from coordinator.commit.payloads import HalfReader
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import OpSource, TxState, decode_op, half_partition

pytestmark = pytest.mark.integration


def _ops(env: Env) -> list:
    return [decode_op(s.value) for s in read_topic(env.bootstrap, env.topics.op)]


def test_unknown_resolved_to_commit_by_back_check(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url)
    env.start()
    tx_id = env.producer.transaction(
        [Msg(topic, b"m0", key=b"k"), Msg(topic, b"m1", key=b"k")], TxState.UNKNOWN
    )

    seen = wait_for(env.bootstrap, topic, 2)

    assert [s.value for s in seen] == [b"m0", b"m1"]
    call = check_server.calls_for(tx_id)[0]
    assert (call.group, call.instance, call.attempt) == ("orders", "inst-1", 1)
    assert [m.key for m in call.messages] == [b"k", b"k"]
    verdicts = [op for op in eventually(lambda: _ops(env)) if op.tx_id == tx_id]
    assert [(op.state, op.source) for op in verdicts] == [(TxState.COMMIT, OpSource.CHECK)]


def test_unknown_resolved_to_rollback_by_back_check(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.ROLLBACK
    env.producer.heartbeat(check_server.url)
    handle = env.start()
    tx_id = env.producer.transaction([Msg(topic, b"never")], TxState.UNKNOWN)
    committed = env.producer.transaction([Msg(topic, b"other")], TxState.COMMIT)

    assert eventually(lambda: handle.service.stats["resolved_rolled_back"] >= 1)
    seen = wait_for(env.bootstrap, topic, 1)
    assert [s.headers["txb.tx"] for s in seen] == [committed.encode()]
    assert check_server.calls_for(tx_id)
    assert any(op.tx_id == tx_id and op.state is TxState.ROLLBACK for op in eventually(lambda: _ops(env)))


def test_check_goes_to_another_live_instance_when_the_writer_left(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    dead = CheckServer(SECRET.encode(), script=lambda _req: TxState.ROLLBACK).start()
    env.producer.heartbeat(dead.url, instance="inst-1")
    env.producer.leave(instance="inst-1")  # the writer is gone (tombstone)
    dead.stop()
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url, instance="inst-2")
    env.start()
    tx_id = env.producer.transaction([Msg(topic, b"v")], TxState.UNKNOWN)

    seen = wait_for(env.bootstrap, topic, 1)

    assert [s.value for s in seen] == [b"v"]
    assert check_server.calls_for(tx_id)[0].instance == "inst-1"  # asks about the writer's tx
    assert dead.calls == []


def test_a_200_without_a_verdict_never_counts_as_commit(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: (200, b'{"ok": true}')
    env.producer.heartbeat(check_server.url)
    handle = env.start(max_checks=2)
    tx_id = env.producer.transaction([Msg(topic, b"v")], TxState.UNKNOWN)

    assert eventually(lambda: handle.service.stats["resolved_expired"] >= 1, timeout=60)
    assert len(check_server.calls_for(tx_id)) == 2
    assert read_topic(env.bootstrap, topic) == []


def test_check_url_outside_the_allow_list_is_refused_without_using_up_the_checks(
    env: Env, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """A refused URL is a configuration problem, not an answer: the transaction waits (logged once at
    ERROR, counted) until max_unasked_s, not max_checks."""
    topic = topic_factory()
    env.producer.heartbeat("http://169.254.169.254/latest/meta-data")
    handle = env.start(max_checks=2, max_unasked_s=4.0)
    env.producer.transaction([Msg(topic, b"v")], TxState.UNKNOWN)

    assert eventually(lambda: handle.service.stats["checks_not_asked"] >= 3, timeout=30)
    assert handle.service.stats["resolved_expired"] == 0  # 3 refusals, max_checks 2: not expired
    assert eventually(lambda: handle.service.stats["resolved_expired"] >= 1, timeout=30)
    assert read_topic(env.bootstrap, topic) == []
    expired = read_topic(env.bootstrap, env.topics.expired)
    assert "allowed_check_hosts" in expired[0].headers["txb.reason"].decode()
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "allowed_check_hosts" in r.getMessage()]
    assert len(errors) == 1


def test_late_commit_after_a_rollback_verdict_changes_nothing(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.ROLLBACK
    env.producer.heartbeat(check_server.url)
    handle = env.start()
    tx_id, partition = env.producer.halves([Msg(topic, b"late")])
    assert eventually(lambda: handle.service.stats["resolved_rolled_back"] >= 1)

    env.producer.op(tx_id, partition, TxState.COMMIT, count=1)
    marker = env.producer.transaction([Msg(topic, b"marker")], TxState.COMMIT)

    seen = wait_for(env.bootstrap, topic, 1)
    assert [s.headers["txb.tx"] for s in seen] == [marker.encode()]
    assert eventually(lambda: handle.service.stats["conflicting_ops"] == 1)


def test_check_timing_ignores_the_producer_clock_and_honours_check_after(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url)
    env.start(check_delay_s=4.0)
    # The wire producer stamps txb.ts = 1 ms after the epoch: were it used, both would be checked at once.
    slow, _ = env.producer.halves([Msg(topic, b"slow")])
    fast, _ = env.producer.halves([Msg(topic, b"fast")], check_after=0.2)

    wait_for(env.bootstrap, topic, 1)
    assert check_server.calls_for(fast)
    assert check_server.calls_for(slow) == []
    seen = wait_for(env.bootstrap, topic, 2)
    assert [s.value for s in seen] == [b"fast", b"slow"]


@pytest.mark.parametrize("batches", [True, False], ids=["batched", "producer-without-batches"])
def test_many_unknown_transactions_are_resolved_in_few_requests(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], batches: bool
) -> None:
    topic = topic_factory()
    check_server.batches = batches
    committed: set[str] = set()
    check_server.script = lambda req: TxState.COMMIT if req.tx_id in committed else TxState.ROLLBACK
    env.producer.heartbeat(check_server.url)
    # Every transaction is due at once (check_after 0.5 s), so the coordinator batches them.
    tx_ids = [
        env.producer.halves(
            [Msg(topic, f"m{i}".encode(), key=f"k{i}".encode())], check_after=0.5, flush=False
        )[0]
        for i in range(60)
    ]
    env.producer.flush()
    committed.update(tx_ids[::2])
    handle = env.start(check_batch_size=25)

    seen = wait_for(env.bootstrap, topic, 30)

    assert sorted(s.headers["txb.tx"].decode() for s in seen) == sorted(committed)
    assert eventually(lambda: handle.service.stats["resolved_rolled_back"] == 30)
    assert sorted(c.tx_id for c in check_server.calls) == sorted(tx_ids)  # each asked exactly once
    if batches:
        assert 1 < max(check_server.batch_sizes) <= 25
        assert check_server.posts < len(tx_ids)
    else:  # the batches in flight when the first was refused (up to 4), then one tx per request
        assert set(check_server.batch_sizes) == {1}
        assert 1 <= check_server.rejected <= 4


def test_restored_transactions_are_checked_only_after_the_unread_decisions(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    """As after a takeover: the next coordinator restores open transactions whose producer's
    COMMIT was written after the last commit. It reads those ops before checking anything."""
    topic = topic_factory(partitions=3)
    check_server.script = lambda _req: TxState.ROLLBACK  # would contradict every producer COMMIT
    env.producer.heartbeat(check_server.url)
    first = env.start(check_delay_s=3600.0)
    halves = [
        env.producer.halves([Msg(topic, f"m{i}".encode(), key=f"k{i}".encode())], flush=False)
        for i in range(300)
    ]
    env.producer.flush()
    assert eventually(lambda: first.service.stats["half_records"] == 300)
    first.stop()  # commits: 300 open transactions in <ns>_state
    for tx_id, partition in halves:
        env.producer.op(tx_id, partition, TxState.COMMIT, count=1, flush=False)
    env.producer.flush()
    time.sleep(1.0)  # every half is past its check time in the next coordinator's settings

    second = env.start(check_delay_s=0.5)

    seen = wait_for(env.bootstrap, topic, len(halves))
    assert sorted(s.headers["txb.tx"].decode() for s in seen) == sorted(tx for tx, _ in halves)
    assert second.service.stats["checks"] == 0
    assert check_server.calls == []


def test_a_check_carries_the_user_headers_even_when_the_payload_was_evicted(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url)
    env.start(payload_cache_bytes=1, check_delay_s=1.0)  # every payload evicted at the first commit
    tx_id = env.producer.transaction(
        [Msg(topic, b"v", key=b"order-9", headers=(("trace", b"t-1"),))], TxState.UNKNOWN
    )

    seen = wait_for(env.bootstrap, topic, 1)

    assert [(s.value, s.headers.get("trace")) for s in seen] == [(b"v", b"t-1")]
    [call] = check_server.calls_for(tx_id)
    assert [(m.key, dict(m.headers).get("trace")) for m in call.messages] == [(b"order-9", b"t-1")]


def test_restored_payloads_are_read_back_once_per_pass_not_once_per_request(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restored transaction has no payload; its check needs the user's headers. Each request
    asks about transactions from every half partition, so re-reading per request read each
    partition once per request: 20,000 pending took 48 s to check instead of 4 (issue 18)."""
    topic = topic_factory(partitions=3)
    check_server.script = lambda _req: TxState.COMMIT
    groups = ("g0", "g1", "g2")
    for group in groups:
        env.producer.heartbeat(check_server.url, group=group)
    # offset_metadata_bytes 0: every open transaction is a <ns>_state entry, restored without payload.
    first = env.start(check_delay_s=3600.0, offset_metadata_bytes=0)
    count = 300
    tx_ids = []
    for i in range(count):
        env.producer.group = groups[i % len(groups)]  # a request (one group) spans the partitions
        message = Msg(topic, f"m{i}".encode(), key=f"k{i}".encode(), headers=(("trace", f"t-{i}".encode()),))
        tx_ids.append(env.producer.halves([message], flush=False)[0])
    env.producer.flush()
    assert eventually(lambda: first.service.stats["half_records"] == count)
    first.stop()  # commits: 300 open transactions in <ns>_state
    reads: list[tuple[int, list[int]]] = []
    read = HalfReader.read

    def counted(self: HalfReader, partition: int, offsets: list[int], timeout: float = 30.0) -> Any:
        reads.append((partition, list(offsets)))
        return read(self, partition, offsets, timeout)

    monkeypatch.setattr(HalfReader, "read", counted)

    # 30 requests of 10 (10 per group), all in flight at once: one pass asks about every due one.
    env.start(check_delay_s=0.5, check_batch_size=10, check_concurrency_per_group=40)

    seen = wait_for(env.bootstrap, topic, count)
    assert sorted(s.headers["txb.tx"].decode() for s in seen) == sorted(tx_ids)
    assert sorted(c.tx_id for c in check_server.calls) == sorted(tx_ids)  # each asked exactly once
    assert {c.tx_id: dict(c.messages[0].headers)["trace"] for c in check_server.calls} == {
        tx_id: f"t-{i}".encode() for i, tx_id in enumerate(tx_ids)
    }
    # Each half partition read once (a second read only if its ops were caught up in two passes),
    # and the records spanned add up to about the 300 halves, not 300 per request.
    per_partition = Counter(partition for partition, _offsets in reads)
    assert max(per_partition.values()) <= 2, reads
    assert sum(offsets[-1] - offsets[0] + 1 for _p, offsets in reads) <= 2 * count, reads


def test_a_transaction_is_held_behind_an_earlier_undecided_one_sharing_a_key_past_their_first(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    """Per-key order counts every key of a transaction, not only its first message's: B, written
    after A and committed at once, shares A's second key and waits until A's back-check."""
    topic = topic_factory(1)
    first_a = b"a-first"
    part = env.producer.partition_of("", [Msg(topic, b"", key=first_a)])
    first_b = next(  # another first key on A's half partition, so one coordinator orders both
        k for k in (f"b-first-{i}".encode() for i in range(1000)) if half_partition(k, PARTITIONS) == part
    )
    released = threading.Event()
    check_server.script = lambda _req: TxState.COMMIT if released.is_set() else TxState.UNKNOWN
    env.producer.heartbeat(check_server.url)
    handle = env.start(max_checks=1000)

    a = env.producer.transaction(
        [Msg(topic, b"A1", key=first_a), Msg(topic, b"A2", key=b"shared")], TxState.UNKNOWN
    )
    env.producer.transaction(
        [Msg(topic, b"B1", key=first_b), Msg(topic, b"B2", key=b"shared")], TxState.COMMIT
    )

    assert eventually(lambda: handle.service.stats["held_for_key_order"] >= 1)
    assert eventually(lambda: check_server.calls_for(a))  # A is being checked, B is decided
    assert read_topic(env.bootstrap, topic) == []  # B waits for A
    released.set()

    seen = wait_for(env.bootstrap, topic, 4)
    assert [s.value for s in seen] == [b"A1", b"A2", b"B1", b"B2"]
