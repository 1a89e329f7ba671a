"""The asyncio producer on a real broker: the same records as the blocking one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.kafka_helpers import read_topic
from txbridge import AsyncTransactionProducer, LocalTransaction, Message, TxState, wire
from txbridge.errors import KafkaOperationError
from txbridge.wire import Topics

from .conftest import PARTITIONS, SECRET

pytestmark = pytest.mark.integration


def make_async(kafka_bootstrap: str, namespace: str, group: str, **options: Any) -> AsyncTransactionProducer:
    options.setdefault("check", lambda txn: TxState.UNKNOWN)
    return AsyncTransactionProducer(
        kafka_bootstrap, group, secret=SECRET, namespace=namespace, partitions=PARTITIONS, **options
    )


def ops_by_tx(bootstrap: str, topics: Topics) -> dict[str, list[dict[str, Any]]]:
    """Each transaction's decisions in the op topic (records of one decision or batches)."""
    ops: dict[str, list[dict[str, Any]]] = {}
    for record in read_topic(bootstrap, topics.op):
        for op in wire.decode_ops(record.value):
            body: dict[str, Any] = {"state": op.state.value}
            if op.count is not None:
                body["count"] = op.count
            ops.setdefault(op.tx_id, []).append(body)
    return ops


def test_async_send_in_transaction_with_sync_and_async_execute(
    kafka_bootstrap: str, namespace: str, topics: Topics, group_factory: Callable[[], str], orders: str
) -> None:
    async def execute_async(txn: LocalTransaction, arg: Any) -> TxState:
        await asyncio.sleep(0.01)
        return TxState.COMMIT if arg % 2 else TxState.ROLLBACK

    def execute_raising(txn: LocalTransaction, arg: Any) -> TxState:
        raise RuntimeError("local failure")

    async def main() -> tuple[list[Any], Any]:
        async with make_async(kafka_bootstrap, namespace, group_factory()) as producer:
            results = await asyncio.gather(
                *(
                    producer.send_in_transaction(Message(orders, f"{i}".encode(), key=b"k"), execute_async, i)
                    for i in range(40)
                )
            )
            failed = await producer.send_in_transaction(Message(orders, b"x"), execute_raising)
            return list(results), failed

    results, failed = asyncio.run(main())
    assert [r.state for r in results] == [TxState.COMMIT if i % 2 else TxState.ROLLBACK for i in range(40)]
    assert {r.partition for r in results} == {wire.half_partition(b"k", PARTITIONS)}
    assert failed.state is TxState.UNKNOWN
    assert isinstance(failed.error, RuntimeError)
    ops = ops_by_tx(kafka_bootstrap, topics)
    for i, result in enumerate(results):
        expected = {"state": "COMMIT", "count": 1} if i % 2 else {"state": "ROLLBACK"}
        [op] = ops[result.tx_id]
        assert {k: op[k] for k in expected} == expected
    assert failed.tx_id not in ops
    assert len(read_topic(kafka_bootstrap, topics.half)) == 41


def test_async_context_manager_commit_and_rollback(
    kafka_bootstrap: str,
    namespace: str,
    topics: Topics,
    group_factory: Callable[[], str],
    *,
    orders: str,
    payments: str,
) -> None:
    async def main() -> tuple[str, str, str]:
        async with make_async(kafka_bootstrap, namespace, group_factory()) as producer:
            async with producer.transaction() as tx:
                await tx.send(Message(orders, b"a"))
                await tx.send(Message(payments, b"b"))
            committed = tx.tx_id
            assert tx.result is not None
            assert tx.result.state is TxState.COMMIT
            rolled_back: list[str] = []

            async def failing() -> None:
                async with producer.transaction() as tx2:
                    rolled_back.append(tx2.tx_id)
                    await tx2.send(Message(orders, b"c"))
                    raise KeyError("no such customer")

            with pytest.raises(KeyError):
                await failing()
            # The built-in check server answers while the loop runs.
            request = wire.CheckRequest(committed, producer.settings.group, producer.instance_id, 1)
            body = request.encode()
            async with httpx.AsyncClient() as client:
                response = await client.post(
                    producer.check_url, content=body, headers={wire.SIGNATURE_HEADER: wire.sign(SECRET, body)}
                )
            return committed, rolled_back[0], response.text

    committed, rolled_back, answer = asyncio.run(main())
    ops = ops_by_tx(kafka_bootstrap, topics)
    assert [(o["state"], o.get("count")) for o in ops[committed]] == [("COMMIT", 2)]
    assert [o["state"] for o in ops[rolled_back]] == ["ROLLBACK"]
    assert json.loads(answer) == {"state": "UNKNOWN"}


def test_async_failed_half_write_never_runs_the_local_transaction(
    kafka_bootstrap: str, namespace: str, topics: Topics, group_factory: Callable[[], str], orders: str
) -> None:
    # Records above the broker's limit are refused: the half write fails for real (txbridge's own
    # limit is raised so that it does not refuse them first).
    ran: list[str] = []

    async def main() -> tuple[Any, Any]:
        async with make_async(
            kafka_bootstrap,
            namespace,
            group_factory(),
            max_message_bytes=2_000_000,
            extra_config={"message.max.bytes": 2_000_000},
        ) as producer:
            result = await producer.send_in_transaction(
                [Message(orders, b"small", key=b"k"), Message(orders, b"x" * 1_500_000, key=b"k")],
                lambda txn, arg: ran.append(txn.tx_id) or TxState.COMMIT,
            )
            tx = producer.transaction()

            async def too_large() -> None:
                async with tx:
                    await tx.send(Message(orders, b"x" * 1_500_000))
                    ran.append(tx.tx_id)

            with pytest.raises(KafkaOperationError, match="MSG_SIZE_TOO_LARGE"):
                await too_large()
            return result, tx

    result, tx = asyncio.run(main())
    assert ran == []
    assert result.state is TxState.ROLLBACK
    assert isinstance(result.error, KafkaOperationError)
    assert tx.result is not None
    assert tx.result.state is TxState.ROLLBACK
    ops = ops_by_tx(kafka_bootstrap, topics)
    # The first half record may have landed: a ROLLBACK op says it must not be published.
    assert [o["state"] for o in ops[result.tx_id]] == ["ROLLBACK"]
    assert [o["state"] for o in ops[tx.tx_id]] == ["ROLLBACK"]


def test_async_send_takes_a_sequence_as_one_half_record_each_in_order(
    kafka_bootstrap: str, namespace: str, topics: Topics, group_factory: Callable[[], str], orders: str
) -> None:
    async def main() -> str:
        async with make_async(kafka_bootstrap, namespace, group_factory()) as producer:
            async with producer.transaction() as tx:
                await tx.send([Message(orders, f"{i}".encode()) for i in range(3)])
            assert tx.result is not None
            assert tx.result.state is TxState.COMMIT
            return tx.tx_id

    tx_id = asyncio.run(main())
    [op] = ops_by_tx(kafka_bootstrap, topics)[tx_id]
    assert (op["state"], op["count"]) == ("COMMIT", 3)
    halves = [r for r in read_topic(kafka_bootstrap, topics.half) if r.headers["txb.tx"] == tx_id.encode()]
    assert [r.value for r in halves] == [b"0", b"1", b"2"]
