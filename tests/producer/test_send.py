"""What the producer makes visible on a real broker: half and op records, and nothing else."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.kafka_helpers import Seen, read_topic
from txbridge import LocalTransaction, Message, StringSerializer, TransactionProducer, TxState, wire
from txbridge.errors import SerializationError
from txbridge.wire import Topics

from .conftest import PARTITIONS

pytestmark = pytest.mark.integration


def records_of(bootstrap: str, topic: str, tx_id: str) -> list[Seen]:
    return [r for r in read_topic(bootstrap, topic) if r.key == tx_id.encode()]


def ops_of(bootstrap: str, topics: Topics, tx_id: str) -> list[dict[str, Any]]:
    return [json.loads(r.value or b"") for r in records_of(bootstrap, topics.op, tx_id)]


def test_commit_writes_acknowledged_halves_then_one_commit_op(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    topic_factory: Any,
) -> None:
    real = topic_factory()
    producer = make_producer(value_serializer=StringSerializer(), key_serializer=StringSerializer())
    seen_during_local: list[int] = []

    def execute(txn: LocalTransaction, arg: Any) -> TxState:
        # The half records are acknowledged before the local transaction runs.
        seen_during_local.append(len(records_of(kafka_bootstrap, topics.half, txn.tx_id)))
        assert arg == "my-arg"
        assert [m.value for m in txn.messages] == ["v0", "v1"]
        return TxState.COMMIT

    messages = [
        Message(real, "v0", key="customer-7", headers=[("trace", b"abc")]),
        Message(real, "v1", key="other", partition=0, check_after=2.5),
    ]
    result = producer.send_in_transaction(messages, execute, "my-arg")

    assert result.state is TxState.COMMIT
    assert result.error is None
    assert result.op_acknowledged
    assert seen_during_local == [2]
    expected_partition = wire.half_partition(b"customer-7", PARTITIONS)
    assert result.partition == expected_partition

    halves = records_of(kafka_bootstrap, topics.half, result.tx_id)
    assert [h.partition for h in halves] == [expected_partition] * 2
    decoded = [wire.decode_half(h.value, list(h.headers.items())) for h in halves]
    assert [d.seq for d in decoded] == [0, 1]
    assert [d.value for d in decoded] == [b"v0", b"v1"]
    assert [d.key for d in decoded] == [b"customer-7", b"other"]
    assert decoded[0].user_headers == (("trace", b"abc"),)
    assert decoded[1].partition == 0
    assert decoded[1].check_after_s == 2.5
    assert {d.group for d in decoded} == {producer.settings.group}
    assert {d.instance for d in decoded} == {producer.instance_id}

    ops = records_of(kafka_bootstrap, topics.op, result.tx_id)
    assert [o.partition for o in ops] == [expected_partition]
    op = wire.decode_op(ops[0].value)
    assert (op.state, op.source, op.count) == (TxState.COMMIT, wire.OpSource.PRODUCER, 2)
    # Nothing reaches the real topic before a coordinator republishes it.
    assert read_topic(kafka_bootstrap, real, isolation="read_uncommitted") == []


@pytest.mark.parametrize(
    ("answer", "expected_state", "expected_ops"),
    [
        (TxState.ROLLBACK, TxState.ROLLBACK, ["ROLLBACK"]),
        (TxState.UNKNOWN, TxState.UNKNOWN, []),
        ("commit", TxState.COMMIT, ["COMMIT"]),  # a plain string is accepted
        (None, TxState.UNKNOWN, []),  # anything else is UNKNOWN, never COMMIT
    ],
)
def test_local_outcomes_write_the_matching_op(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
    *,
    answer: Any,
    expected_state: TxState,
    expected_ops: list[str],
) -> None:
    producer = make_producer()
    result = producer.send_in_transaction(Message(orders, b"v"), lambda txn, arg: answer)
    assert result.state is expected_state
    assert [o["state"] for o in ops_of(kafka_bootstrap, topics, result.tx_id)] == expected_ops
    assert len(records_of(kafka_bootstrap, topics.half, result.tx_id)) == 1
    # Without a key, the tx id picks the partition.
    assert result.partition == wire.half_partition(result.tx_id.encode(), PARTITIONS)


def test_exception_in_local_transaction_is_unknown_and_writes_no_op(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    producer = make_producer()

    def execute(txn: LocalTransaction, arg: Any) -> TxState:
        raise RuntimeError("database went away")

    result = producer.send_in_transaction(Message(orders, b"v", key=b"k"), execute)
    assert result.state is TxState.UNKNOWN
    assert isinstance(result.error, RuntimeError)
    assert ops_of(kafka_bootstrap, topics, result.tx_id) == []
    assert len(records_of(kafka_bootstrap, topics.half, result.tx_id)) == 1


def test_failed_half_write_never_runs_the_local_transaction(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    # Records above the broker's limit are refused: the half write fails for real (txbridge's own
    # limit is raised so that it does not refuse them first).
    producer = make_producer(max_message_bytes=2_000_000, extra_config={"message.max.bytes": 2_000_000})
    ran: list[str] = []
    result = producer.send_in_transaction(
        [Message(orders, b"small", key=b"k"), Message(orders, b"x" * 1_500_000, key=b"k")],
        lambda txn, arg: ran.append(txn.tx_id) or TxState.COMMIT,
    )
    assert ran == []
    assert result.state is TxState.ROLLBACK
    assert result.error is not None
    # The first half record may have landed: a ROLLBACK op says it must not be published.
    assert [o["state"] for o in ops_of(kafka_bootstrap, topics, result.tx_id)] == ["ROLLBACK"]


def test_unserializable_value_raises_before_anything_is_written(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    producer = make_producer()  # BytesSerializer: a str value is a mistake
    with pytest.raises(SerializationError, match="StringSerializer"):
        producer.send_in_transaction(Message(orders, "text"), lambda txn, arg: TxState.COMMIT)
    assert read_topic(kafka_bootstrap, topics.half) == []


def test_context_manager_commits_on_clean_exit(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
    payments: str,
) -> None:
    producer = make_producer()
    with producer.transaction(order_key=b"order-1") as tx:
        tx.send(Message(orders, b"a", key=b"x"))
        tx.send(Message(payments, b"b"), wait=False)
        tx.prepare()
        # Both half records are durable here: the local commit may happen now.
        halves_before_commit = len(records_of(kafka_bootstrap, topics.half, tx.tx_id))
    assert halves_before_commit == 2
    assert tx.result is not None
    assert tx.result.state is TxState.COMMIT
    assert tx.result.partition == wire.half_partition(b"order-1", PARTITIONS)
    ops = ops_of(kafka_bootstrap, topics, tx.tx_id)
    assert [(o["state"], o["count"]) for o in ops] == [("COMMIT", 2)]
    halves = records_of(kafka_bootstrap, topics.half, tx.tx_id)
    assert [h.headers["txb.topic"] for h in halves] == [orders.encode(), payments.encode()]
    assert {h.partition for h in halves} == {tx.result.partition}


def test_send_takes_a_sequence_as_one_half_record_each_in_order(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
    payments: str,
) -> None:
    producer = make_producer()
    with producer.transaction(order_key=b"order-2") as tx:
        tx.send([Message(orders, b"a", key=b"x"), Message(payments, b"b"), Message(orders, b"c")])
        halves_before_commit = len(records_of(kafka_bootstrap, topics.half, tx.tx_id))
        with pytest.raises(TypeError, match="non-empty sequence of Message"):
            tx.send([])
    assert halves_before_commit == 3  # acknowledged before send returned
    assert tx.result is not None
    assert tx.result.state is TxState.COMMIT
    assert [(o["state"], o["count"]) for o in ops_of(kafka_bootstrap, topics, tx.tx_id)] == [("COMMIT", 3)]
    halves = records_of(kafka_bootstrap, topics.half, tx.tx_id)
    assert [(h.headers["txb.topic"], h.value) for h in halves] == [
        (orders.encode(), b"a"),
        (payments.encode(), b"b"),
        (orders.encode(), b"c"),
    ]


def test_context_manager_rolls_back_on_exception_and_reraises(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    producer = make_producer()
    tx_ids: list[str] = []

    def run() -> None:
        with producer.transaction() as tx:
            tx_ids.append(tx.tx_id)
            tx.send(Message(orders, b"a"), wait=False)
            raise ValueError("local write failed")

    with pytest.raises(ValueError, match="local write failed"):
        run()
    ops = ops_of(kafka_bootstrap, topics, tx_ids[0])
    assert [o["state"] for o in ops] == ["ROLLBACK"]
    assert "count" not in ops[0]
    assert len(records_of(kafka_bootstrap, topics.half, tx_ids[0])) == 1


def test_context_manager_can_leave_the_outcome_unknown(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    producer = make_producer()
    with producer.transaction() as tx:
        tx.send(Message(orders, b"a"))
        tx.set_outcome(TxState.UNKNOWN)
    assert tx.result is not None
    assert tx.result.state is TxState.UNKNOWN
    assert ops_of(kafka_bootstrap, topics, tx.tx_id) == []


def test_many_concurrent_transactions_share_one_producer(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    orders: str,
) -> None:
    producer = make_producer()
    count = 200

    def execute(txn: LocalTransaction, arg: int) -> TxState:
        return TxState.COMMIT if arg % 3 else TxState.ROLLBACK

    def one(i: int) -> Any:
        messages = [Message(orders, f"{i}-{j}".encode(), key=f"k{i % 10}".encode()) for j in range(2)]
        return producer.send_in_transaction(messages, execute, i)

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(count)))

    assert len({r.tx_id for r in results}) == count
    assert [r.state for r in results] == [TxState.COMMIT if i % 3 else TxState.ROLLBACK for i in range(count)]
    assert all(r.op_acknowledged and r.error is None for r in results)
    halves = read_topic(kafka_bootstrap, topics.half)
    ops = read_topic(kafka_bootstrap, topics.op)
    assert len(halves) == 2 * count
    assert len(ops) == count
    # Per transaction: both halves and the op on one partition, seq in order, op after halves.
    by_tx: dict[bytes, list[Seen]] = {}
    for record in halves:
        by_tx.setdefault(record.key or b"", []).append(record)
    for result in results:
        records = by_tx[result.tx_id.encode()]
        assert [r.headers["txb.seq"] for r in records] == [b"0", b"1"]
        assert {r.partition for r in records} == {result.partition}
    committed = [json.loads(o.value or b"") for o in ops if json.loads(o.value or b"")["state"] == "COMMIT"]
    assert all(o["count"] == 2 for o in committed)
