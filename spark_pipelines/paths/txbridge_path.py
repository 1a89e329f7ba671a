"""txbridge: half record, local transaction (order row + barrier row), op record.

An UNKNOWN outcome, or a process killed before it wrote the op record, is
resolved by the coordinator's back-check, which the barrier answers from the
database: COMMIT when the order row committed, ROLLBACK (and no late commit)
otherwise. A replacement process of the same producer group answers the checks
of a killed one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spark_pipelines import schema
from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.paths import CrashPoint, LocalFailure, event_for, write_order
from spark_pipelines.store import OrderStore

logger = logging.getLogger(__name__)


class TxbridgePath:
    """Publish each order as a txbridge transaction around the DB write."""

    name = "txbridge"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        store: OrderStore,
        *,
        group: str,
        secret: str,
        namespace: str,
        partitions: int,
        check_after: float | None = None,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.client_config = dict(client_config or {})
        self.topic = topic
        self.store = store
        self.group = group
        self._secret = secret
        self.namespace = namespace
        self.partitions = partitions
        self.check_after = check_after
        self._producer: Any = None
        self._barrier: Any = None

    def start(self) -> None:
        from txbridge import AvroSerializer, SqlAlchemyBarrier, TransactionProducer

        self._barrier = SqlAlchemyBarrier(self.store.engine)
        self._producer = TransactionProducer(
            self.bootstrap,
            self.group,
            secret=self._secret,
            check=self._barrier.check,
            namespace=self.namespace,
            partitions=self.partitions,
            value_serializer=AvroSerializer(schema.ORDER_CREATED),
            client_config=self.client_config,
        )
        self._producer.__enter__()

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        from txbridge import Message, TxState

        barrier, store = self._barrier, self.store

        def execute(txn: Any, planned: PlannedOrder) -> TxState:
            if planned.fault is Fault.CRASH_AFTER_BEGIN:
                crash("after_half")
            try:
                with barrier.local_transaction(txn.tx_id) as conn:
                    write_order(store, conn, planned)
            except LocalFailure:
                return TxState.ROLLBACK
            if planned.fault is Fault.CRASH_AFTER_DB_COMMIT:
                crash("after_db_commit")
            if planned.fault is Fault.UNKNOWN:
                return TxState.UNKNOWN  # the commit happened; the service never learned it
            return TxState.COMMIT

        event = event_for(order)
        message = Message(self.topic, event.to_dict(), key=event.key(), check_after=self.check_after)
        result = self._producer.send_in_transaction(message, execute, order)
        if result.error is not None:
            logger.warning("order %s: %s", order.order_id, result.error)
        return str(result.state.value).lower()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.__exit__(None, None, None)
            self._producer = None
