"""The native path's transaction errors, on the real broker with librdkafka's own state machine.

A transaction is made to fail the way librdkafka fails one underneath the service: a record
the broker refuses (larger than the topic's ``max.message.bytes``) puts it in an abortable
state, so the next produce is refused (``_STATE``) and a commit must abort.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from spark_pipelines import schema
from spark_pipelines.faults import Fault, FaultPlan, PlannedOrder
from spark_pipelines.paths.native import NativePath
from spark_pipelines.store import OrderStore
from tests.kafka_helpers import read_topic
from txbridge import kafka

pytestmark = pytest.mark.integration


class _FailsOnce:
    """The real producer; before the first ``before`` call, its open transaction fails."""

    def __init__(self, real: kafka.Producer, refusing_topic: str, before: str) -> None:
        self._real = real
        self.refusing_topic = refusing_topic
        self._before = before
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._real, name)
        if name != self._before or self.failed:
            return attribute

        def failing_first(*args: Any, **kwargs: Any) -> Any:
            self.failed = True
            self._fail_transaction()  # the transaction is open: begin_transaction came first
            return attribute(*args, **kwargs)

        return failing_first

    def _fail_transaction(self) -> None:
        self._real.produce(self.refusing_topic, value=b"x" * 4096)
        self._real.flush(30)


def _fail_once_before(path: NativePath, topic_factory: Callable[..., str], before: str) -> _FailsOnce:
    """Give ``path`` a producer whose transaction fails just before its first ``before`` call."""
    refusing = topic_factory(partitions=1, config={"max.message.bytes": "1024"})
    producer = _FailsOnce(path._opened(), refusing, before)
    path._producer = producer  # type: ignore[assignment]
    return producer


def _orders(count: int) -> list[PlannedOrder]:
    plan = FaultPlan.generate(seed=5, orders=count, customers=1, kill_coordinator=False)
    return [dataclasses.replace(o, fault=Fault.NONE) for o in plan.orders]


def _never(stage: str) -> NoReturn:
    raise AssertionError(f"no crash is planned ({stage})")


@pytest.fixture
def native(
    kafka_bootstrap: str, topic_factory: Callable[..., str], unique_name: Callable[[str], str], tmp_path: Path
) -> tuple[NativePath, str]:
    topic = topic_factory(partitions=1)
    store = OrderStore(f"sqlite:///{tmp_path / 'orders.db'}", "native")
    store.create()
    path = NativePath(kafka_bootstrap, topic, store, transactional_id=unique_name("native"))
    path.start()
    return path, topic


def test_a_transaction_that_fails_before_its_record_goes_in_is_begun_again_and_publishes_once(
    native: tuple[NativePath, str],
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path, topic = native
    producer = _fail_once_before(path, topic_factory, "produce")
    orders = _orders(3)

    with caplog.at_level(logging.WARNING, logger="spark_pipelines.paths.native"):
        outcomes = [path.handle(order, _never) for order in orders]
    path.close()

    assert producer.failed
    assert outcomes == ["committed"] * 3
    seen = read_topic(kafka_bootstrap, topic)
    assert [schema.decode(s.value or b"").order_id for s in seen] == [o.order_id for o in orders]
    assert read_topic(kafka_bootstrap, producer.refusing_topic) == []
    assert {o.order_id for o in path.store.committed()} == {o.order_id for o in orders}
    assert "aborting the transaction and beginning it again" in caplog.text


def test_a_commit_that_must_abort_after_the_db_commit_leaves_that_order_unpublished(
    native: tuple[NativePath, str],
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    # native's gap, which the report counts as lost: the order is in the DB, not in Kafka.
    path, topic = native
    _fail_once_before(path, topic_factory, "commit_transaction")
    orders = _orders(3)

    outcomes = [path.handle(order, _never) for order in orders]
    path.close()

    assert outcomes == ["aborted_after_db_commit", "committed", "committed"]
    seen = read_topic(kafka_bootstrap, topic)
    assert [schema.decode(s.value or b"").order_id for s in seen] == [o.order_id for o in orders[1:]]
    assert {o.order_id for o in path.store.committed()} == {o.order_id for o in orders}


class _LeftOverAnswer:
    """The real producer, but its first commit times out and the resumed one fails as librdkafka's does.

    librdkafka's race (spark_pipelines.paths.native.NativePath._resume_commit): a step of the
    timed-out call answers the resumed call, whose commit then fails with ``_STATE`` before it
    sent EndTxn. The transaction stays open on the real producer, as it does in the race.
    """

    def __init__(self, real: kafka.Producer) -> None:
        self._real = real
        self.commits = 0
        self.calls_after_commit: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if self.commits >= 3 and name != "flush":  # closing it flushes it
            self.calls_after_commit.append(name)
        return getattr(self._real, name)

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1
        if self.commits == 1:
            timed_out = kafka.KafkaError(kafka.KafkaError._TIMED_OUT, "Timed out, call again", retriable=True)
            raise kafka.KafkaException(timed_out)
        if self.commits == 2:
            state = kafka.KafkaError(kafka.KafkaError._STATE, "Operation not valid in state BeginCommit")
            raise kafka.KafkaException(state)
        self._real.commit_transaction(timeout)


def test_a_lost_commit_result_is_resumed_past_librdkafkas_left_over_answer_and_publishes_once(
    native: tuple[NativePath, str], kafka_bootstrap: str
) -> None:
    # CI died here: "Operation not valid in state BeginCommit" from the resumed commit.
    path, topic = native
    producer = _LeftOverAnswer(path._opened())
    path._producer = producer  # type: ignore[assignment]
    orders = _orders(3)
    orders[0] = dataclasses.replace(orders[0], fault=Fault.UNKNOWN)

    outcomes = [path.handle(order, _never) for order in orders]
    path.close()

    assert outcomes == ["committed_after_retry", "committed", "committed"]
    assert producer.commits == 3
    # The producer whose call timed out is not used again: an answer left over in it cannot
    # reach the next order's calls.
    assert producer.calls_after_commit == []
    seen = read_topic(kafka_bootstrap, topic)
    assert [schema.decode(s.value or b"").order_id for s in seen] == [o.order_id for o in orders]
    assert {o.order_id for o in path.store.committed()} == {o.order_id for o in orders}
