"""The native-transaction baseline on a real broker: its clock covers the run, its counts add up."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.kafka_native import native_transactions
from txbridge import kafka

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("per_txn", [1, 10])
def test_native_transactions_count_what_a_read_committed_consumer_sees(
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    group_factory: Callable[[], str],
    per_txn: int,
) -> None:
    topic = topic_factory(partitions=2)

    figure = native_transactions(
        kafka_bootstrap, topic, size=64, per_txn=per_txn, duration_s=1.0, concurrency=3
    )

    assert figure.seconds >= 1.0  # every producer ran the whole second, none left at once
    assert figure.messages > 0
    assert figure.values["txn_per_s"] * figure.seconds * per_txn == pytest.approx(figure.messages)
    consumer = kafka.consumer(kafka_bootstrap, group_factory())
    consumer.subscribe([topic])
    seen = 0
    try:
        while seen < figure.messages and (batch := kafka.consume_available(consumer, 1000, 5.0)):
            seen += sum(1 for msg in batch if msg.error() is None)
    finally:
        consumer.close()
    assert seen == figure.messages
