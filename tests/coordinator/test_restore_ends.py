"""A take-over's read of ``<ns>_state`` ends at the high watermarks it asked for at its start,
and an open transaction below one holds it, with a warning that names the held partitions."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pytest

from coordinator.commit import changelog
from coordinator.state.partition import HalfRef, PendingTx
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
    assert restored.owners == {0: [OwnerRecord("committed-0")], 1: [OwnerRecord("open-1")]}


def _entry(
    producer: kafka.Producer, topic: str, partition: int, tx_id: str, *, resolved: bool = False
) -> None:
    value = (
        None if resolved else changelog.encode_entry(PendingTx(tx_id, partition, halves={0: HalfRef(5, 10)}))
    )
    producer.produce(topic, value, tx_id.encode(), partition=partition)


def test_a_kept_reader_reads_every_take_over_afresh(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    """One reader serves a coordinator's take-overs: each read sees what was committed before
    it, and only the partitions it asked for, whatever an earlier read of them left queued."""
    topic = topic_factory(partitions=3, prefix="state")
    plain = kafka.producer(kafka_bootstrap)
    _entry(plain, topic, 0, "a")
    _owner(plain, topic, 1, "first-1")
    plain.flush(10)
    reader = changelog.StateReader(kafka_bootstrap, topic)
    try:
        first = reader.restore([0, 1, 2], timeout=30.0)
        assert {p: [tx.tx_id for tx in txs] for p, txs in first.pending.items()} == {0: ["a"]}
        assert reader.owners([0, 1, 2], timeout=30.0) == {1: OwnerRecord("first-1")}

        _entry(plain, topic, 0, "a", resolved=True)
        _entry(plain, topic, 0, "b")
        _owner(plain, topic, 2, "first-2")
        _owner(plain, topic, 1, "second-1")
        plain.flush(10)

        assert reader.owners([1, 2], timeout=30.0) == {1: OwnerRecord("second-1"), 2: OwnerRecord("first-2")}
        again = reader.restore([0, 1, 2], timeout=30.0)
        assert {p: [tx.tx_id for tx in txs] for p, txs in again.pending.items()} == {0: ["b"]}
        assert again.owners == {
            1: [OwnerRecord("first-1"), OwnerRecord("second-1")],
            2: [OwnerRecord("first-2")],
        }
        assert reader.restore([1], timeout=30.0).pending == {}  # partition 0 is not read now
    finally:
        reader.close()


def test_a_kept_reader_whose_read_failed_reads_again_with_new_clients(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=2, prefix="state")
    open_tx = kafka.producer(kafka_bootstrap, transactional_id=f"open-{uuid.uuid4().hex[:8]}")
    kafka.init_transactions(open_tx, 30)
    open_tx.begin_transaction()
    _entry(open_tx, topic, 1, "late")
    open_tx.flush(10)
    reader = changelog.StateReader(kafka_bootstrap, topic)
    try:
        with pytest.raises(KafkaOperationError, match=r"partitions \[1\] did not reach their end"):
            reader.restore([0, 1], timeout=2.0)
        assert reader.owners([0, 1], timeout=30.0) == {}  # below the last stable offset: nothing yet

        open_tx.commit_transaction(30)
        restored = reader.restore([0, 1], timeout=30.0)
        assert [tx.tx_id for tx in restored.pending[1]] == ["late"]
    finally:
        reader.close()
