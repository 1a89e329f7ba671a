"""End to end with the producer SDK and its SQLite barrier: what a read_committed consumer sees."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.kafka_helpers import read_topic, wait_for
from txbridge import AsyncTransactionProducer, Message, SqliteBarrier, TransactionProducer, TxState
from txbridge.errors import BarrierConflictError
from txbridge.wire import op_tx_ids

pytestmark = pytest.mark.integration


def test_sdk_transactions_through_the_coordinator(
    env: Env, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory()
    barrier = SqliteBarrier(str(tmp_path / "orders.db"))
    handle = env.start(check_delay_s=1.0)

    def commit_then(answer: TxState) -> Callable[[Any, Any], TxState]:
        def run(txn: Any, _arg: Any) -> TxState:
            with barrier.local_transaction(txn.tx_id):
                pass
            return answer

        return run

    def crash_before_commit(_txn: Any, _arg: Any) -> TxState:
        raise RuntimeError("the process died before its local commit")

    with TransactionProducer(
        env.bootstrap,
        "orders-svc",
        secret=SECRET,
        check=barrier.check,
        namespace=env.namespace,
        partitions=PARTITIONS,
        # The coordinator's back-check is what this test is about; a producer that stays up
        # would settle these UNKNOWNs itself (tests/producer/test_settle.py).
        settle_unknown=False,
    ) as producer:
        committed = producer.send_in_transaction(
            [Message(topic, b"c1", key=b"o-1"), Message(topic, b"c2", key=b"o-1")],
            commit_then(TxState.COMMIT),
        )
        unknown_committed = producer.send_in_transaction(
            Message(topic, b"u1", key=b"o-2"), commit_then(TxState.UNKNOWN)
        )
        unknown_lost = producer.send_in_transaction(
            Message(topic, b"never-1", key=b"o-3"), crash_before_commit
        )
        rolled_back = producer.send_in_transaction(
            Message(topic, b"never-2"), lambda _t, _a: TxState.ROLLBACK
        )

        seen = wait_for(env.bootstrap, topic, 3)
        assert eventually(lambda: handle.service.stats["check_verdicts"] >= 2)

    assert (unknown_committed.state, unknown_lost.state) == (TxState.UNKNOWN, TxState.UNKNOWN)
    assert sorted(s.value for s in seen) == [b"c1", b"c2", b"u1"]
    by_tx = {s.headers["txb.tx"].decode() for s in seen}
    assert by_tx == {committed.tx_id, unknown_committed.tx_id}
    assert rolled_back.tx_id not in by_tx
    # The barrier made the rollback verdict final: the late local commit cannot happen.
    with pytest.raises(BarrierConflictError), barrier.local_transaction(unknown_lost.tx_id):
        pass
    assert len(read_topic(env.bootstrap, topic)) == 3


def test_the_asyncio_producers_batched_decisions_republish_each_commit_once_in_key_order(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    # Transactions that end in one turn of the event loop share an op record per op partition
    # (txbridge.wire.decode_ops); the coordinator must apply every decision in it.
    topic = topic_factory()
    env.start()
    count = 120

    async def main() -> list[Any]:
        async with AsyncTransactionProducer(
            env.bootstrap,
            "orders-svc",
            secret=SECRET,
            namespace=env.namespace,
            partitions=PARTITIONS,
            check=lambda _t: TxState.UNKNOWN,
        ) as producer:
            return list(
                await asyncio.gather(
                    *(
                        producer.send_in_transaction(
                            Message(topic, str(i).encode(), key=f"k-{i % 5}".encode()),
                            lambda _t, i: TxState.ROLLBACK if i % 7 == 0 else TxState.COMMIT,
                            i,
                        )
                        for i in range(count)
                    )
                )
            )

    results = asyncio.run(main())
    assert all(r.op_acknowledged for r in results)
    committed = [str(i).encode() for i in range(count) if i % 7]
    seen = wait_for(env.bootstrap, topic, len(committed))
    ops = read_topic(env.bootstrap, env.topics.op)
    # Batched: fewer op records than transactions, every transaction decided once in them.
    assert len(ops) < count
    decided = [tx_id for o in ops for tx_id in op_tx_ids(o.key, o.value)]
    assert sorted(decided) == sorted(r.tx_id for r in results)
    assert sorted(s.value for s in seen) == sorted(committed)
    # Per key, in the order the transactions were sent (one key's transactions share a
    # partition, and the producer's decisions of one partition keep their order in a batch).
    for k in range(5):
        of_key = [s.value for s in seen if s.key == f"k-{k}".encode()]
        assert of_key == [v for v in committed if int(v) % 5 == k]
    assert len(read_topic(env.bootstrap, topic)) == len(committed)
