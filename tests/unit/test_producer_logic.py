"""The producer's pure logic: messages, the transaction lifecycle, serializers, half records."""

from __future__ import annotations

import pytest

from txbridge import AvroSerializer, BytesSerializer, LocalTransaction, Message, StringSerializer, TxState
from txbridge.errors import SerializationError, TransactionStateError
from txbridge.transaction import (
    TransactionLifecycle,
    TransactionListener,
    TxPhase,
    build_half_messages,
    coerce_state,
    local_transaction_from_check,
)
from txbridge.wire import CheckMessage, CheckRequest, decode_half

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
    life = TransactionLifecycle("tx")
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


def test_half_messages_follow_the_wire_format() -> None:
    halves = build_half_messages(
        "tx-1",
        [Message("orders", "v", key="k", headers={"trace": b"1"}), Message("audit", None, partition=2)],
        first_seq=3,
        group="g",
        instance="i",
        key_serializer=StringSerializer(),
        value_serializer=StringSerializer(),
    )
    back = [decode_half(h.value, h.to_headers()) for h in halves]
    assert [(b.seq, b.topic, b.key, b.value, b.partition) for b in back] == [
        (3, "orders", b"k", b"v", None),
        (4, "audit", None, None, 2),  # a null value is carried as a tombstone
    ]
    assert back[0].user_headers == (("trace", b"1"),)
    assert {h.record_key() for h in halves} == {b"tx-1"}


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
