"""Which failures quarantine a committed transaction: only the record's own fault (pure, no broker)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from coordinator.commit.writer import RECORD_FAULTS, RecordRefusedError, TransactionWriter
from coordinator.state.republisher import OutRecord
from txbridge.errors import KafkaOperationError


class _Refusing:
    """A producer whose produce() refuses with ``code`` (the client's own checks)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def produce(self, topic: str, *_args: Any, **_kwargs: Any) -> None:
        raise KafkaException(KafkaError(self.code))


class _Msg:
    def topic(self) -> str:
        return "orders"


TRANSIENT = [
    KafkaError._MSG_TIMED_OUT,
    KafkaError._PURGE_QUEUE,
    KafkaError._PURGE_INFLIGHT,
    KafkaError._TRANSPORT,
    KafkaError._STATE,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._UNKNOWN_PARTITION,
]


@pytest.mark.parametrize("code", TRANSIENT)
def test_a_delivery_failure_that_can_pass_never_poisons_the_transaction(code: int) -> None:
    writer = TransactionWriter(None)
    writer._delivered("tx-1", KafkaError(code), _Msg())
    assert writer.poisoned == {}  # the commit fails; the transaction goes out again


@pytest.mark.parametrize("code", sorted(RECORD_FAULTS))
def test_a_records_own_fault_poisons_it(code: int) -> None:
    writer = TransactionWriter(None)
    writer._delivered("tx-1", KafkaError(code), _Msg())
    assert "tx-1" in writer.poisoned


@pytest.mark.parametrize("code", TRANSIENT)
def test_a_refusal_that_can_pass_aborts_and_retries_instead_of_quarantining(code: int) -> None:
    writer = TransactionWriter(_Refusing(code))
    with pytest.raises(KafkaOperationError) as raised:
        writer.republish("tx-1", [OutRecord("orders", b"k", b"v")])
    assert not isinstance(raised.value, RecordRefusedError)
    assert raised.value.txn_requires_abort
    assert writer.poisoned == {}


def test_a_record_the_client_refuses_for_its_size_is_quarantined_as_the_first_one() -> None:
    writer = TransactionWriter(_Refusing(KafkaError.MSG_SIZE_TOO_LARGE))
    reason = writer.republish("tx-1", [OutRecord("orders", b"k", b"v")])
    assert reason is not None
    assert "refused a message to orders" in reason
