"""Producer decisions: what a read_committed consumer of the real topics sees."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def test_commit_is_visible_once_and_rollback_never(env: Env, topic_factory: Callable[..., str]) -> None:
    topic = topic_factory(partitions=2)
    env.start()
    committed = [
        env.producer.transaction(
            [Msg(topic, f"c{i}".encode(), key=f"k{i}".encode(), headers=(("h", b"v"),))], TxState.COMMIT
        )
        for i in range(20)
    ]
    rolled_back = [
        env.producer.transaction([Msg(topic, f"r{i}".encode())], TxState.ROLLBACK) for i in range(10)
    ]

    seen = wait_for(env.bootstrap, topic, 20, timeout=60)

    assert sorted(s.value for s in seen) == sorted(f"c{i}".encode() for i in range(20))
    by_value = {s.value: s for s in seen}
    assert by_value[b"c3"].key == b"k3"
    assert by_value[b"c3"].headers == {"h": b"v", "txb.tx": committed[3].encode()}
    assert not {s.headers["txb.tx"] for s in seen} & {t.encode() for t in rolled_back}


def test_nothing_visible_before_the_commit_op(env: Env, topic_factory: Callable[..., str]) -> None:
    topic = topic_factory()
    handle = env.start(check_delay_s=30.0)  # no back-check interferes
    tx_id, partition = env.producer.halves([Msg(topic, b"a"), Msg(topic, b"b")])
    eventually(lambda: handle.service.stats["half_records"] >= 2)
    eventually(lambda: handle.service.stats["kafka_transactions"] >= 1)

    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []

    env.producer.op(tx_id, partition, TxState.COMMIT, count=2)
    seen = wait_for(env.bootstrap, topic, 2)
    assert [s.value for s in seen] == [b"a", b"b"]


def test_multi_topic_transaction_appears_all_at_once(env: Env, topic_factory: Callable[..., str]) -> None:
    orders, payments = topic_factory(), topic_factory()
    handle = env.start(check_delay_s=30.0)
    messages = [Msg(orders, b"o1", key=b"k"), Msg(payments, b"p1", key=b"k"), Msg(orders, b"o2", key=b"k")]
    tx_id, partition = env.producer.halves(messages)
    eventually(lambda: handle.service.stats["half_records"] >= 3)
    assert read_topic(env.bootstrap, orders) == read_topic(env.bootstrap, payments) == []

    env.producer.op(tx_id, partition, TxState.COMMIT, count=3)
    seen_orders = wait_for(env.bootstrap, orders, 2)
    seen_payments = read_topic(env.bootstrap, payments)

    assert [s.value for s in seen_orders] == [b"o1", b"o2"]
    assert [s.value for s in seen_payments] == [b"p1"]


def test_an_op_read_before_its_halves_still_commits(env: Env, topic_factory: Callable[..., str]) -> None:
    # Halves acknowledged before the op, as the SDK writes them (docs/wire-format.md), then both
    # read by a coordinator started afterwards: it fetches the op and half partitions in no set
    # order, so it may see the op first. (Written the other way round, op before halves, a
    # COMMIT is given up as an orphan by design; tests/coordinator/test_state.py has both orders.)
    topic = topic_factory()
    messages = [Msg(topic, b"x", key=b"key-1"), Msg(topic, b"y", key=b"key-1")]
    tx_id = "0190aaaa-0000-7000-8000-000000000001"
    partition = env.producer.partition_of(tx_id, messages)
    env.producer.halves(messages, tx_id=tx_id)
    env.producer.op(tx_id, partition, TxState.COMMIT, count=2)
    env.start(check_delay_s=30.0)

    seen = wait_for(env.bootstrap, topic, 2)
    assert [s.value for s in seen] == [b"x", b"y"]


def test_evicted_payloads_are_re_read_by_offset(env: Env, topic_factory: Callable[..., str]) -> None:
    topic = topic_factory()
    handle = env.start(check_delay_s=30.0, payload_cache_bytes=1)  # every payload is evicted at a commit
    messages = [Msg(topic, f"v{i}".encode(), key=b"k", headers=(("n", str(i).encode()),)) for i in range(3)]
    tx_id, partition = env.producer.halves(messages)
    assert eventually(lambda: handle.service.stats["half_records"] >= 3)
    assert eventually(
        lambda: all(
            ref.message is None
            for state in handle.service.partitions.values()
            for tx in state.pending.values()
            for ref in tx.halves.values()
        )
    )

    env.producer.op(tx_id, partition, TxState.COMMIT, count=3)

    seen = wait_for(env.bootstrap, topic, 3)
    assert [(s.key, s.value, s.headers["n"]) for s in seen] == [
        (b"k", f"v{i}".encode(), str(i).encode()) for i in range(3)
    ]
