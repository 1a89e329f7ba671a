"""What an admin call says when another admin's call on the same transaction fenced it before
its commit (txbridge/admin/_once.py). CI saw the losing call's write fail as a bare
``Unable to produce message: Local: Fatal error (_FATAL)``, reported as a plain failure, not as
the race it lost. The real race runs in tests/coordinator/test_admin_concurrent.py; this pins
the classification of each error shape it can end with, without waiting for the race to hit it."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from txbridge import kafka
from txbridge.admin._once import REQUEUE, AlreadyDecidedError, Marker, _not_published
from txbridge.errors import KafkaOperationError
from txbridge.wire import TxState

MINE = Marker("tx-1", REQUEUE, TxState.COMMIT, attempt="mine")
WINNER = Marker("tx-1", REQUEUE, TxState.COMMIT, attempt="theirs", new_tx_id="tx-2")


def _error(code: int) -> KafkaOperationError:
    return kafka.to_error(KafkaException(KafkaError(code)), "writing the decision on tx tx-1")


def test_a_call_refused_after_a_fatal_error_is_fatal() -> None:
    assert _error(KafkaError._FATAL).fatal
    assert not _error(KafkaError._MSG_TIMED_OUT).fatal


@pytest.mark.parametrize("code", [KafkaError._FATAL, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH])
def test_a_fenced_write_names_the_winners_decision(code: int) -> None:
    error = _not_published(MINE, _error(code), lambda: [WINNER])
    assert isinstance(error, AlreadyDecidedError)
    assert "at the same time (requeued as tx-2); nothing was published by this call" in str(error)


@pytest.mark.parametrize("code", [KafkaError._FATAL, KafkaError._FENCED])
def test_a_fenced_write_before_the_winner_committed_says_it_was_fenced(code: int) -> None:
    error = _not_published(MINE, _error(code), lambda: [])
    assert not isinstance(error, AlreadyDecidedError)
    assert "at the same time" in str(error)
    assert "nothing was published by this call" in str(error)


def test_any_other_write_failure_says_nothing_was_published_without_reading() -> None:
    def reread() -> list[Marker]:
        raise AssertionError("not a race: nothing to look for")

    error = _not_published(MINE, _error(KafkaError._MSG_TIMED_OUT), reread)
    assert str(error).endswith("(nothing was published)")
    assert "at the same time" not in str(error)
