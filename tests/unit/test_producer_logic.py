"""The producer's pure logic: messages, the transaction lifecycle, serializers, half records, refusals."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.state.republisher import plan_republish, record_size
from txbridge import AvroSerializer, BytesSerializer, LocalTransaction, Message, StringSerializer, TxState
from txbridge.errors import (
    ConfigurationError,
    MessageRejectedError,
    MessageTooLargeError,
    SerializationError,
    TransactionStateError,
    TxBridgeError,
    UnknownTopicError,
    WireFormatError,
)
from txbridge.limits import DEFAULT_MAX_MESSAGE_BYTES, republished_size
from txbridge.producer.catalog import TopicCatalog
from txbridge.producer.records import Decision, RecordEncoder
from txbridge.producer.settings import ProducerSettings
from txbridge.producer.transaction import ProducerTransaction, TxPhase
from txbridge.transaction import TransactionListener, coerce_state, local_transaction_from_check
from txbridge.wire import (
    CheckMessage,
    CheckRequest,
    OpRecord,
    OpSource,
    decode_half,
    decode_op,
    decode_ops,
    new_tx_id,
    op_tx_ids,
)

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}


def test_message_normalises_headers_and_validates() -> None:
    assert Message("t", b"v", headers={"a": b"1"}).headers == (("a", b"1"),)
    assert Message("t", b"v", headers=[("a", b"1"), ("a", b"2")]).headers == (("a", b"1"), ("a", b"2"))
    assert Message("t", b"v", headers={"txb.tags": b"TAGA"}).headers == (("txb.tags", b"TAGA"),)
    with pytest.raises(ValueError, match="topic"):
        Message("", b"v")
    with pytest.raises(TypeError, match="bytes"):
        Message("t", b"v", headers={"a": "text"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="protocol header"):
        Message("t", b"v", headers={"txb.seq": b"3"})
    with pytest.raises(ValueError, match="partition"):
        Message("t", b"v", partition=-1)


def test_lifecycle_allows_only_the_table() -> None:
    settings = ProducerSettings.build("broker:9092", "g", b"secret", partitions=1)
    life = ProducerTransaction(settings, TopicCatalog(), lambda *record: None)
    life.advance(TxPhase.SENDING)
    with pytest.raises(TransactionStateError, match="SENDING to COMMITTED"):
        life.advance(TxPhase.COMMITTED)  # never commit with half records in flight
    life.advance(TxPhase.PREPARED)
    life.advance(TxPhase.SENDING)
    life.advance(TxPhase.PREPARED)
    life.advance(TxPhase.COMMITTED)
    assert life.finished
    for target in TxPhase:
        assert not life.can(target)
    with pytest.raises(TransactionStateError):
        life.advance(TxPhase.ROLLED_BACK)  # the first decision is final
    assert life.history == [TxPhase.NEW, TxPhase.SENDING, TxPhase.PREPARED, TxPhase.SENDING, TxPhase.PREPARED]


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (TxState.COMMIT, TxState.COMMIT),
        ("ROLLBACK", TxState.ROLLBACK),
        ("commit", TxState.COMMIT),
        ("yes", TxState.UNKNOWN),
        (True, TxState.UNKNOWN),
        (None, TxState.UNKNOWN),
    ],
)
def test_answers_other_than_a_state_are_unknown(answer: object, state: TxState) -> None:
    assert coerce_state(answer) is state


def test_serializers_round_trip_and_fail_clearly() -> None:
    avro = AvroSerializer(SCHEMA)
    data = avro.serialize({"id": "o1", "amount": 12})
    assert isinstance(data, bytes)
    assert avro.deserialize(data) == {"id": "o1", "amount": 12}
    assert avro.serialize(None) is None
    with pytest.raises(SerializationError, match="Order"):
        avro.serialize({"id": "o1"})
    with pytest.raises(SerializationError, match="invalid Avro schema"):
        AvroSerializer({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})
    assert StringSerializer().serialize("é") == "é".encode()
    assert StringSerializer().deserialize(b"abc") == "abc"
    assert BytesSerializer().serialize(bytearray(b"ab")) == b"ab"
    with pytest.raises(SerializationError):
        BytesSerializer().serialize(12)


def _encoder() -> RecordEncoder:
    return RecordEncoder("g", "i-é", StringSerializer(), StringSerializer())


def test_half_records_follow_the_wire_format() -> None:
    halves = _encoder().halves(
        "tx-1",
        [
            Message("orders", "v", key="k", headers={"trace": b"1"}, check_after=2),
            Message("audit", None, partition=2),
        ],
        first_seq=3,
    )
    back = [decode_half(h.value, h.headers) for h in halves]
    assert [(b.seq, b.topic, b.key, b.value, b.partition, b.check_after_s) for b in back] == [
        (3, "orders", b"k", b"v", None, 2.0),
        (4, "audit", None, None, 2, None),  # a null value is carried as a tombstone
    ]
    assert back[0].user_headers == (("trace", b"1"),)
    assert (back[0].group, back[0].instance) == ("g", "i-é")
    assert {h.key for h in halves} == {b"tx-1"}
    assert [h.message_key for h in halves] == [b"k", None]
    # Byte for byte what the wire module encodes for the same half message.
    for half, decoded in zip(halves, back, strict=True):
        assert half.headers == decoded.to_headers()


def test_half_records_refuse_what_the_serializer_refuses() -> None:
    with pytest.raises(SerializationError, match="StringSerializer"):
        _encoder().halves("tx-1", [Message("orders", b"not text")], first_seq=0)


@pytest.mark.parametrize(
    ("state", "count", "reason"),
    [(TxState.COMMIT, 2, ""), (TxState.ROLLBACK, None, 'half record "x" not acknowledged: é')],
)
def test_op_records_are_the_wire_modules_bytes(state: TxState, count: int | None, reason: str) -> None:
    tx_id = new_tx_id()
    key, value = _encoder().op(tx_id, state, count=count, reason=reason)
    decoded = decode_op(value)
    assert (decoded.tx_id, decoded.state, decoded.source, decoded.count, decoded.reason) == (
        tx_id,
        state,
        OpSource.PRODUCER,
        count,
        reason,
    )
    assert (key, value) == OpRecord(
        tx_id, state, OpSource.PRODUCER, count, "g", "i-é", decoded.timestamp_ms, reason
    ).encode()


def test_a_batch_of_decisions_reads_back_as_each_transactions_op() -> None:
    ids = [new_tx_id() for _ in range(3)]
    decisions = [
        Decision(ids[0], TxState.COMMIT, 2),
        Decision(ids[1], TxState.ROLLBACK, None, 'local "x" failed: é'),
        Decision(ids[2], TxState.COMMIT, 1),
    ]
    key, value = _encoder().ops(decisions)
    assert key is None  # a batch decides several transactions: no one tx id keys it
    ops = decode_ops(value)
    assert [(o.tx_id, o.state, o.count, o.reason) for o in ops] == [
        (ids[0], TxState.COMMIT, 2, ""),
        (ids[1], TxState.ROLLBACK, None, 'local "x" failed: é'),
        (ids[2], TxState.COMMIT, 1, ""),
    ]
    assert {(o.source, o.group, o.instance) for o in ops} == {(OpSource.PRODUCER, "g", "i-é")}
    assert len({o.timestamp_ms for o in ops}) == 1
    assert ops[0].timestamp_ms > 0
    assert op_tx_ids(key, value) == ids
    with pytest.raises(WireFormatError, match="batch"):
        decode_op(value)  # the one-decision reader refuses a batch rather than read its first


def test_check_request_becomes_a_local_transaction_without_values() -> None:
    request = CheckRequest(
        "tx-1", "g", "i", 3, (CheckMessage("orders", b"k", (("a", b"1"), ("txb.tx", b"x"))),)
    )
    txn = local_transaction_from_check(request)
    assert txn == LocalTransaction("tx-1", "g", (Message("orders", None, key=b"k", headers={"a": b"1"}),), 3)


def test_listener_protocol_is_structural() -> None:
    class Listener:
        def execute_local_transaction(self, txn: LocalTransaction, arg: object) -> TxState:
            return TxState.COMMIT

        def check_local_transaction(self, txn: LocalTransaction) -> TxState:
            return TxState.COMMIT

    assert isinstance(Listener(), TransactionListener)
    assert not isinstance(object(), TransactionListener)


# ---------------------------------------------------------------- what the coordinator could republish


def test_the_producer_measures_a_message_as_the_coordinator_does() -> None:
    tx_id = new_tx_id()
    messages = [
        Message("orders", "v" * 300, key="k", headers={"trace": b"1", "é-name": b"\xff" * 7}),
        Message("audit", None, partition=2),  # a tombstone, no key
        Message("orders", "", key="", headers=[("a", b""), ("a", b"2")]),
    ]
    halves = _encoder().halves(tx_id, messages, first_seq=0)
    for message, half in zip(messages, halves, strict=True):
        decoded = decode_half(half.value, half.headers)
        coordinator_size = record_size(decoded.key, decoded.value, decoded.republish_headers())
        assert (
            republished_size(half.key, half.message_key, half.value, message.header_pairs) == coordinator_size
        )
        # The coordinator republishes it at that limit and quarantines it one byte below.
        assert isinstance(plan_republish([decoded], coordinator_size, lambda topic: 3), list)
        assert "above max_message_bytes" in str(plan_republish([decoded], coordinator_size - 1, lambda t: 3))


def test_the_producers_default_limit_is_the_coordinators() -> None:
    assert CoordinatorConfig().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 1_048_576


def test_the_topic_catalog_trusts_a_listing_for_the_topics_it_showed_only() -> None:
    catalog = TopicCatalog(ttl_s=10.0)
    orders, missing = [Message("orders", b"")], [Message("missing", b"")]
    assert catalog.stale(orders, 100.0)  # never listed

    catalog.update({"orders": 3, "broken": None}, listed_at=100.0)
    assert not catalog.stale(orders, 109.0)
    assert catalog.partitions("orders") == 3
    assert catalog.partitions("broken") is None  # a topic with an error is not usable
    assert catalog.stale(missing, 109.0)  # missing: asked again at the next send
    assert catalog.stale([*orders, *missing], 109.0)
    assert not catalog.stale(missing, 99.0)  # a send begun before that listing takes its answer
    assert catalog.stale(orders, 111.0)  # older than ttl_s
    assert catalog.known(orders)
    assert not catalog.known(missing)

    catalog.keep(111.0)  # a listing failed at 111: the topics shown stay trusted, missing ones do not
    assert not catalog.stale(orders, 120.0)
    assert catalog.stale(missing, 120.0)
    assert catalog.stale(orders, 122.0)


def _factory(
    catalog: TopicCatalog, written: list[Any], **options: Any
) -> Callable[[], ProducerTransaction[None]]:
    options.setdefault("partitions", 12)  # a started producer has read it from <ns>_half
    settings = ProducerSettings.build("broker:9092", "g", b"secret", **options)
    return partial(ProducerTransaction, settings, catalog, lambda *record: written.append(record))


def test_a_transaction_refuses_what_the_coordinator_could_not_republish_and_writes_nothing() -> None:
    catalog, written = TopicCatalog(), list[Any]()
    catalog.update({"orders": 2}, listed_at=0.0)
    factory = _factory(catalog, written, max_message_bytes=200)
    refusals = [
        (
            Message("nope", b"v"),
            UnknownTopicError,
            "topic 'nope' does not exist at broker:9092: create topic nope",
        ),
        (Message("orders", b"v", partition=2), UnknownTopicError, "no partition 2 \\(it has 2\\)"),
        (Message("orders", b"v" * 200), MessageTooLargeError, "raise max_message_bytes on the coordinator"),
    ]
    for message, error, text in refusals:
        tx = factory()
        with pytest.raises(error, match=text) as refused:
            tx.enqueue([message])
        assert isinstance(refused.value, MessageRejectedError)
        assert isinstance(refused.value, TxBridgeError)
        assert refused.value.topic == message.topic
        assert "not written" in str(refused.value)
        assert (tx.phase, tx.messages, tx.partition) == (TxPhase.NEW, [], None)
    assert written == []

    tx = factory()
    tx.enqueue([Message("orders", b"v", partition=1)])
    assert len(written) == 1


def test_a_transaction_commits_only_once_its_halves_are_acknowledged_and_ends_once() -> None:
    catalog, written = TopicCatalog(), list[Any]()
    catalog.update({"orders": 2}, listed_at=0.0)
    tx = _factory(catalog, written)()
    tx.enqueue([Message("orders", b"v")])
    with pytest.raises(TransactionStateError, match="half records are not all acknowledged"):
        tx.decide(TxState.COMMIT)  # its half record is still in flight
    tx.take_pending()
    tx.settle([])
    tx.decide(TxState.COMMIT)

    for state in (TxState.COMMIT, TxState.ROLLBACK, TxState.UNKNOWN):
        with pytest.raises(TransactionStateError, match=r"cannot (go from COMMITTED|commit)"):
            tx.decide(state)  # a transaction ends once
    with pytest.raises(TransactionStateError, match="COMMITTED: no more messages"):
        tx.enqueue([Message("orders", b"late")])  # nothing is sent after its op record
    assert [record[0] for record in written] == ["__txbridge_half", "__txbridge_op"]
    assert tx.phase is TxPhase.COMMITTED


def test_a_transaction_whose_half_failed_sends_nothing_more_and_can_only_roll_back() -> None:
    catalog, written = TopicCatalog(), list[Any]()
    catalog.update({"orders": 2}, listed_at=0.0)
    tx = _factory(catalog, written)()
    tx.enqueue([Message("orders", b"v")])
    tx.take_pending()
    lost = TransactionStateError("not acknowledged")
    with pytest.raises(TransactionStateError, match="not acknowledged"):
        tx.settle_or_raise([lost])
    with pytest.raises(TransactionStateError, match="already failed to write a half record"):
        tx.enqueue([Message("orders", b"w")])
    assert tx.exit_decision(None)[0] is TxState.ROLLBACK  # a clean exit cannot commit it
    with pytest.raises(TransactionStateError, match="not all acknowledged"):
        tx.decide(TxState.COMMIT)
    tx.decide(TxState.ROLLBACK)
    assert [record[0] for record in written] == ["__txbridge_half", "__txbridge_op"]
    assert tx.outcome(TxState.ROLLBACK, lost, ()).state is TxState.ROLLBACK


def test_max_message_bytes_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, "1MB", True):
        with pytest.raises(ConfigurationError, match="max_message_bytes"):
            ProducerSettings.build("broker:9092", "g", b"secret", max_message_bytes=bad)
