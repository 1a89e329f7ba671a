"""A partition's transactional producer: produce with back-pressure, refusals, delivery failures.

A committed transaction whose records the client refuses, or the broker rejects
at delivery, must not block the others: its tx id becomes *poisoned*, the Kafka
transaction is aborted if part of it was already produced, and on the retry the
coordinator quarantines it instead of republishing.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, cast

from coordinator.state.republisher import OutRecord
from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import KafkaError, KafkaException, Producer

logger = logging.getLogger(__name__)

_TOPIC_CACHE_S = 30.0
#: Failures that are the record's own fault: sending it again cannot succeed, so its committed
#: transaction is quarantined (and can be requeued once the cause is fixed). Anything else (a
#: leader lost mid-transaction, a timeout, an abort's purge, fencing, a producer in an abortable
#: state) aborts the Kafka transaction and the record goes out again in the next one. An allow
#: list, not a deny list: a failure nobody foresaw must delay a committed transaction, never
#: set it aside (a broker kill once quarantined committed transactions for "Message timed out").
RECORD_FAULTS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,  # the client's own check too
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)


class RecordRefusedError(KafkaOperationError):
    """The client or the broker refused a record for a fault of its own (:data:`RECORD_FAULTS`)."""


_MISSING_CACHE_S = 1.0


class TransactionWriter:
    """Wraps the transactional producer of one owned partition (the service owns the transaction calls).

    ``sizes`` is the partition-count cache, shared by the writers of one coordinator so that a
    topic is looked up once, not once per partition.

    A record without a partition goes where the producer's partitioner puts it: ``murmur2_random``
    (``txbridge.kafka.PARTITIONER``), the partition Kafka's Java producer picks for its key, on
    the producer's own metadata (which a partition computed from another count could contradict).
    """

    def __init__(
        self, producer: Producer | None, sizes: dict[str, tuple[int | None, float]] | None = None
    ) -> None:
        self.producer = producer
        self.poisoned: dict[str, str] = {}  # tx id -> why it cannot be republished
        #: Whether each republished record reports its delivery to :meth:`_delivered`. Off until
        #: a Kafka transaction fails: a Python delivery callback takes the GIL once per record on
        #: the commit thread, in ``commit_transaction``, against the loop that holds it. A record
        #: the broker refuses fails its transaction's commit; the cycle then turns reports on
        #: for the transactions that follow (:meth:`CommitCycle._on_transaction_errors`), so the
        #: retry finds the record and poisons its transaction, and off again after a commit.
        self.report_each = False
        #: The transactional id and the ``<ns>_state`` partition (its journal) under which each
        #: partition's positions are written (:func:`txbridge.wire.journal_key`).
        self.journal: tuple[str, int] = ("", 0)
        self._topic_sizes: dict[str, tuple[int | None, float]] = {} if sizes is None else sizes

    def produce(self, record: OutRecord, *, tx_id: str | None = None) -> None:
        """Produce ``record``; with ``tx_id`` and :attr:`report_each`, a delivery failure poisons
        that transaction.

        Raises:
            KafkaOperationError: the client refused the record.
        """
        # Positional arguments, no keyword dict: one call per republished record and per
        # ``<ns>_state`` record, on the loop's thread. Partition -1 is librdkafka's "unassigned":
        # the producer's partitioner picks it, as when the argument is left out.
        topic = record.topic
        partition = -1 if record.partition is None else record.partition
        headers = cast("kafka.Headers", record.headers)
        on_delivery = partial(self._delivered, tx_id) if tx_id is not None and self.report_each else None
        producer = kafka.opened(self.producer, "the coordinator's producer")
        while True:
            try:
                producer.produce(topic, record.value, record.key, partition, on_delivery, headers=headers)
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain
            except KafkaException as exc:
                kerr = exc.args[0] if exc.args else None
                if isinstance(kerr, KafkaError) and kerr.code() in RECORD_FAULTS:
                    raise RecordRefusedError(f"producing to {topic}: {kerr.str()}") from exc
                error = kafka.to_error(exc, f"producing to {topic}")
                error.txn_requires_abort = True  # sent again in the next Kafka transaction
                raise error from exc
            except Exception as exc:
                raise kafka.to_error(exc, f"producing to {topic}") from exc
            else:
                return

    def republish(self, tx_id: str, records: list[OutRecord]) -> str | None:
        """Produce a committed transaction's records. Returns why not, when refused before any went out.

        Raises:
            KafkaOperationError: a record refused for its own fault after part of the transaction
                was produced (``txn_requires_abort``): it is poisoned, so the retry quarantines it.
                Any other refusal propagates too, unpoisoned: the Kafka transaction is aborted and
                the whole transaction goes out again in the next one.
        """
        for index, record in enumerate(records):
            try:
                self.produce(record, tx_id=tx_id)
            except RecordRefusedError as exc:
                reason = f"the producer refused a message to {record.topic}: {exc}"
                if index == 0:
                    return reason
                self.poisoned[tx_id] = reason
                raise KafkaOperationError(reason, txn_requires_abort=True) from exc
        return None

    def _delivered(self, tx_id: str, err: Any, msg: Any) -> None:
        if err is None:
            return
        if err.code() not in RECORD_FAULTS:  # the commit fails, the transaction is sent again
            logger.info("tx %s: a message to %s failed (%s): sent again", tx_id, msg.topic(), err.str())
            return
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
        metadata = (
            kafka.opened(self.producer, "the coordinator's producer")
            .list_topics(topic, timeout=10)
            .topics.get(topic)
        )
        size = None if metadata is None or metadata.error is not None else len(metadata.partitions)
        self._topic_sizes[topic] = (size, time.monotonic())
        return size
