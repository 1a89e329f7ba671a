"""The coordinator's transactional producer: produce with back-pressure, refusals, delivery failures.

A committed transaction whose records the client refuses, or the broker rejects
at delivery, must not block the others: its tx id becomes *poisoned*, the Kafka
transaction is aborted if part of it was already produced, and on the retry the
coordinator quarantines it instead of republishing.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from coordinator.republisher import OutRecord
from txbridge import _kafka
from txbridge.errors import KafkaOperationError

logger = logging.getLogger(__name__)

_TOPIC_CACHE_S = 30.0
_MISSING_CACHE_S = 1.0


class TransactionWriter:
    """Wraps the transactional producer for one coordinator (the service owns the transaction calls).

    A record without a partition goes where the producer's partitioner puts it: ``murmur2_random``
    (``txbridge._kafka.PARTITIONER``), the partition Kafka's Java producer picks for its key, on
    the producer's own metadata (which a partition computed from another count could contradict).
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.poisoned: dict[str, str] = {}  # tx id -> why it cannot be republished
        self._topic_sizes: dict[str, tuple[int | None, float]] = {}

    def produce(self, record: OutRecord, *, tx_id: str | None = None) -> None:
        """Produce ``record``; with ``tx_id``, a delivery failure poisons that transaction.

        Raises:
            KafkaOperationError: the client refused the record.
        """
        kwargs: dict[str, Any] = {"key": record.key, "value": record.value, "headers": record.headers}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        if tx_id is not None:
            kwargs["on_delivery"] = partial(self._delivered, tx_id)
        while True:
            try:
                self.producer.produce(record.topic, **kwargs)
            except BufferError:
                self.producer.poll(0.1)  # the local queue is full: let deliveries drain
            except Exception as exc:
                raise _kafka.to_error(exc, f"producing to {record.topic}") from exc
            else:
                return

    def republish(self, tx_id: str, records: list[OutRecord]) -> str | None:
        """Produce a committed transaction's records. Returns why not, when refused before any went out.

        Raises:
            KafkaOperationError: refused after part of it was produced (``txn_requires_abort``);
                the transaction is poisoned, so the retry quarantines it.
        """
        for index, record in enumerate(records):
            try:
                self.produce(record, tx_id=tx_id)
            except KafkaOperationError as exc:
                if exc.fatal:
                    raise
                reason = f"the producer refused a message to {record.topic}: {exc}"
                if index == 0:
                    return reason
                self.poisoned[tx_id] = reason
                raise KafkaOperationError(reason, txn_requires_abort=True) from exc
        return None

    def _delivered(self, tx_id: str, err: Any, msg: Any) -> None:
        if err is not None:
            reason = f"the broker rejected a message to {msg.topic()}: {err.str()}"
            logger.warning("tx %s: %s", tx_id, reason)
            self.poisoned[tx_id] = reason

    def partitions_of(self, topic: str) -> int | None:
        """Partition count of ``topic`` (cached), None when it does not exist."""
        cached = self._topic_sizes.get(topic)
        # A missing topic is looked up again after a second, not 30: once an operator creates
        # it, a requeued transaction must not be quarantined again for the same cause.
        ttl = _TOPIC_CACHE_S if cached is not None and cached[0] is not None else _MISSING_CACHE_S
        if cached is not None and time.monotonic() - cached[1] < ttl:
            return cached[0]
        metadata = self.producer.list_topics(topic, timeout=10).topics.get(topic)
        size = None if metadata is None or metadata.error is not None else len(metadata.partitions)
        self._topic_sizes[topic] = (size, time.monotonic())
        return size
