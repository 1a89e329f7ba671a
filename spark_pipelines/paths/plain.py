"""Plain produce: DB commit, then produce; at-least-once, no Kafka transaction.

Idempotence is off (``acks=all``, librdkafka's own retries): an application
retry after a lost acknowledgement is a new send either way, so idempotence
would not remove the duplicate it makes. A lost acknowledgement
(``Fault.UNKNOWN``) is injected by dropping the delivery report of a record
the broker did write; the service then retries the send, as at-least-once
services do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spark_pipelines import schema
from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.paths import CrashPoint, LocalFailure, event_for, write_order
from spark_pipelines.store import OrderStore
from txbridge import kafka
from txbridge.errors import KafkaOperationError

logger = logging.getLogger(__name__)

_TIMEOUT_S = 30.0


class PlainPath:
    """Commit the order, then send its event and wait for the acknowledgement."""

    name = "plain"

    def __init__(
        self, bootstrap: str, topic: str, store: OrderStore, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        self.topic = topic
        self.store = store
        self._producer: kafka.Producer | None = None

    def start(self) -> None:
        self._producer = kafka.producer(
            self.bootstrap, self.extra, enable_idempotence=False, acks="all", linger_ms=0
        )

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        if order.fault is Fault.CRASH_AFTER_BEGIN:
            crash("before_db_commit")
        try:
            with self.store.transaction() as conn:
                write_order(self.store, conn, order)
        except LocalFailure:
            return "rolled_back"
        if order.fault is Fault.CRASH_AFTER_DB_COMMIT:
            crash("after_db_commit")
        event = event_for(order)
        value = schema.encode(event)
        self._send(event.key(), value)
        if order.fault is Fault.UNKNOWN:
            # The ack above is treated as lost: the service does not know the send worked.
            self._send(event.key(), value)
            return "committed_resent"
        return "committed"

    def _send(self, key: bytes, value: bytes) -> None:
        producer = self._producer
        assert producer is not None, "start() first"
        errors: list[Any] = []
        producer.produce(self.topic, key=key, value=value, on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(_TIMEOUT_S)
        if not errors or errors[0] is not None:
            reason = errors[0] if errors else "no delivery report"
            raise KafkaOperationError(f"sending to {self.topic} failed: {reason}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(_TIMEOUT_S)
            self._producer = None
