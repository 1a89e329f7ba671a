"""The four ways the order service publishes ``OrderCreated``.

Each path handles one planned order at a time and reports an outcome; a
``crash`` callback marks the point where the runner SIGKILLs the process.

| path | steps |
| --- | --- |
| ``txbridge`` | half record, local transaction (DB + barrier row), op record; back-checks resolve the rest |
| ``native`` | begin, produce, DB commit, Kafka commit |
| ``plain`` | DB commit, then produce (at-least-once, no transaction, idempotence off) |
| ``rocketmq`` | half message, local transaction (DB + barrier row), end; broker checks do the rest |

The first three publish to Kafka; ``rocketmq`` to a RocketMQ (``spark_pipelines/rocketmq.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.schema import OrderCreated
from spark_pipelines.store import OrderStore

KAFKA_PATHS = ("txbridge", "native", "plain")
ROCKETMQ = "rocketmq"
#: Every path, in the order of the report.
ALL_PATHS = (*KAFKA_PATHS, ROCKETMQ)
#: What runs with nothing but Kafka: ``run_workload``'s default.
PATHS = KAFKA_PATHS
#: Paths whose open transactions are finished by back-checks: the run waits for them to settle.
CHECKED_PATHS = ("txbridge", ROCKETMQ)

#: Called at a planned crash point with the step's name; never returns (the process is killed).
CrashPoint = Callable[[str], NoReturn]


class LocalFailure(Exception):
    """The planned failure of a local transaction (say, a declined payment)."""


class OrderPath(Protocol):
    name: str

    def start(self) -> None: ...

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        """Handle one order; return its outcome as the service saw it."""
        ...

    def close(self) -> None: ...


def write_order(store: OrderStore, conn: Any, order: PlannedOrder) -> None:
    """The local transaction's work: insert the order; a planned local failure raises.

    Raises:
        LocalFailure: the plan says this order's local transaction fails.
    """
    store.insert(conn, order)
    if order.fault is Fault.LOCAL_FAIL:
        raise LocalFailure(order.order_id)


def event_for(order: PlannedOrder) -> OrderCreated:
    return OrderCreated(
        order_id=order.order_id,
        customer_id=order.customer_id,
        customer_seq=order.customer_seq,
        amount_cents=order.amount_cents,
        created_ms=int(time.time() * 1000),
    )
