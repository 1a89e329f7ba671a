"""A take-over's read of ``<ns>_state`` ends at the high watermarks it asked for at its start,
and an open transaction below one holds it, with a warning that names the held partitions."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pytest

from coordinator.commit import changelog
from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.wire import OWNER_KEY, OwnerRecord

pytestmark = pytest.mark.integration


def _owner(producer: kafka.Producer, topic: str, partition: int, owner: str) -> None:
    producer.produce(topic, OwnerRecord(owner).encode(), OWNER_KEY, partition=partition)


def test_an_open_transaction_holds_the_restore_of_its_partition_alone_and_is_named(
    kafka_bootstrap: str, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = topic_factory(partitions=3, prefix="state")
    plain = kafka.producer(kafka_bootstrap)
    _owner(plain, topic, 0, "committed-0")
    plain.flush(10)
    open_tx = kafka.producer(kafka_bootstrap, transactional_id=f"open-{uuid.uuid4().hex[:8]}")
    kafka.init_transactions(open_tx, 30)
    open_tx.begin_transaction()
    _owner(open_tx, topic, 1, "open-1")
    open_tx.flush(10)  # written, not committed: partition 1's last stable offset stays below

    held = pytest.raises(KafkaOperationError, match=r"partitions \[1\] did not reach their end")
    with caplog.at_level(logging.WARNING, logger="coordinator.commit.changelog"), held:
        changelog.restore(kafka_bootstrap, topic, [0, 1, 2], timeout=3.0)
    assert "open transactions hold partitions [1]" in caplog.text

    open_tx.commit_transaction(30)
    restored = changelog.restore(kafka_bootstrap, topic, [0, 1, 2], timeout=30.0)
    assert {p: [r.record for r in reads] for p, reads in restored.owners.items()} == {
        0: [OwnerRecord("committed-0")],
        1: [OwnerRecord("open-1")],
    }
