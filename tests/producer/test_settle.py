"""An UNKNOWN local transaction settled by the producer's own decisive check, without a back-check."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.producer.test_send import ops_of
from txbridge import (
    AsyncTransactionProducer,
    LocalTransaction,
    Message,
    SqliteBarrier,
    TransactionProducer,
    TxState,
    decisive,
)
from txbridge.wire import Topics

from .conftest import PARTITIONS, SECRET

pytestmark = pytest.mark.integration


class Flaky(Exception):
    """The database driver lost the answer of a commit that happened (a timeout, say)."""


def _commit_then_raise(barrier: SqliteBarrier) -> Callable[[LocalTransaction, Any], TxState]:
    def execute(txn: LocalTransaction, _arg: Any) -> TxState:
        with barrier.local_transaction(txn.tx_id) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT)")
            conn.execute("INSERT INTO orders VALUES (?)", (txn.tx_id,))
        raise Flaky("commit sent, answer lost")

    return execute


def _nothing_committed(_txn: LocalTransaction, _arg: Any) -> TxState:
    return TxState.UNKNOWN


@pytest.mark.parametrize(
    ("execute_of", "expected"),
    [(_commit_then_raise, TxState.COMMIT), (lambda _b: _nothing_committed, TxState.ROLLBACK)],
    ids=["committed-then-raised", "unknown-nothing-committed"],
)
def test_a_barrier_check_settles_unknown_at_once(
    kafka_bootstrap: str,
    *,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
    tmp_path: Path,
    execute_of: Callable[[SqliteBarrier], Callable[[LocalTransaction, Any], TxState]],
    expected: TxState,
) -> None:
    barrier = SqliteBarrier(tmp_path / "orders.db")
    producer = make_producer(check=barrier.check)
    assert producer.settles_unknown  # the barrier's check is marked decisive

    result = producer.send_in_transaction(Message(orders, b"v", key=b"k"), execute_of(barrier))

    assert result.state is expected
    ops = ops_of(kafka_bootstrap, topics, result.tx_id)
    assert [(o["state"], o["source"]) for o in ops] == [(expected.value, "producer")]
    assert "settled" in ops[0]["reason"]
    # The barrier now holds the decision: a late back-check gets the same answer.
    assert barrier.check(result.tx_id) is expected


def test_a_check_not_marked_decisive_leaves_unknown_to_the_back_check(
    kafka_bootstrap: str, topics: Topics, make_producer: Callable[..., TransactionProducer], orders: str
) -> None:
    asked: list[str] = []

    def check(txn: LocalTransaction) -> TxState:  # e.g. "SELECT ... FROM orders": not decisive
        asked.append(txn.tx_id)
        return TxState.ROLLBACK

    producer = make_producer(check=check)
    result = producer.send_in_transaction(Message(orders, b"v"), _nothing_committed)

    assert result.state is TxState.UNKNOWN
    assert ops_of(kafka_bootstrap, topics, result.tx_id) == []
    assert asked == []  # a slow local transaction keeps the check delay's protection


def test_settle_unknown_false_and_true_override_the_marking(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
    tmp_path: Path,
) -> None:
    barrier = SqliteBarrier(tmp_path / "orders.db")
    off = make_producer(check=barrier.check, settle_unknown=False)
    left = off.send_in_transaction(Message(orders, b"v"), _nothing_committed)
    assert left.state is TxState.UNKNOWN
    assert ops_of(kafka_bootstrap, topics, left.tx_id) == []

    on = make_producer(check=decisive(lambda txn: TxState.ROLLBACK), settle_unknown=None)
    settled = on.send_in_transaction(Message(orders, b"v"), _nothing_committed)
    assert settled.state is TxState.ROLLBACK


def test_the_asyncio_producer_settles_too(
    kafka_bootstrap: str, namespace: str, topics: Topics, orders: str, tmp_path: Path
) -> None:
    barrier = SqliteBarrier(tmp_path / "orders.db")

    async def main() -> Any:
        async with AsyncTransactionProducer(
            kafka_bootstrap,
            "settle-async",
            secret=SECRET,
            check=barrier.check,
            namespace=namespace,
            partitions=PARTITIONS,
        ) as producer:
            return await producer.send_in_transaction(Message(orders, b"v"), _commit_then_raise(barrier))

    result = asyncio.run(main())

    assert result.state is TxState.COMMIT
    assert [o["state"] for o in ops_of(kafka_bootstrap, topics, result.tx_id)] == ["COMMIT"]
