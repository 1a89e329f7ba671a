"""Native Kafka transactions: begin, produce, DB commit, Kafka commit.

A lost commit result (``Fault.UNKNOWN``) is a real timeout: ``commit_transaction``
is given 1 ms, and, as confluent-kafka documents for a retriable error, the
service retries the commit. A restarted process reuses the transactional id,
so ``init_transactions`` fences the killed one and aborts its open transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spark_pipelines import schema
from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.paths import CrashPoint, LocalFailure, event_for, write_order
from spark_pipelines.store import OrderStore
from txbridge import _kafka

logger = logging.getLogger(__name__)

_TIMEOUT_S = 30.0


class NativePath:
    """Publish each order inside its own Kafka transaction around the DB commit."""

    name = "native"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        store: OrderStore,
        transactional_id: str,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        self.topic = topic
        self.store = store
        self.transactional_id = transactional_id
        self._producer: _kafka.Producer | None = None

    def start(self) -> None:
        self._producer = _kafka.producer(
            self.bootstrap, self.extra, transactional_id=self.transactional_id, transaction_timeout_ms=60_000
        )
        self._producer.init_transactions(_TIMEOUT_S)

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        producer = self._producer
        assert producer is not None, "start() first"
        event = event_for(order)
        producer.begin_transaction()
        producer.produce(self.topic, key=event.key(), value=schema.encode(event))
        if order.fault is Fault.CRASH_AFTER_BEGIN:
            producer.flush(_TIMEOUT_S)  # the record is in the log, uncommitted
            crash("after_begin")
        try:
            with self.store.transaction() as conn:
                write_order(self.store, conn, order)
        except LocalFailure:
            # Flush first: librdkafka 2.16 against Kafka 4.1 fails fatally (INVALID_TXN_STATE)
            # when EndTxn(abort) races a produce still in flight.
            producer.flush(_TIMEOUT_S)
            producer.abort_transaction(_TIMEOUT_S)
            return "rolled_back"
        if order.fault is Fault.CRASH_AFTER_DB_COMMIT:
            producer.flush(_TIMEOUT_S)
            crash("after_db_commit")
        if order.fault is Fault.UNKNOWN:
            return self._commit_with_lost_result()
        producer.commit_transaction(_TIMEOUT_S)
        return "committed"

    def _commit_with_lost_result(self) -> str:
        producer = self._producer
        assert producer is not None
        try:
            producer.commit_transaction(0.001)
        except _kafka.KafkaException as exc:
            error = _kafka.to_error(exc, "commit_transaction")
            if not error.retriable:
                logger.warning("commit failed for good, aborting: %s", error)
                producer.flush(_TIMEOUT_S)
                producer.abort_transaction(_TIMEOUT_S)
                return "aborted_after_timeout"
            producer.commit_transaction(_TIMEOUT_S)
            return "committed_after_retry"
        return "committed"  # the commit beat the 1 ms timeout: the fault did not bite

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(_TIMEOUT_S)
            self._producer = None
