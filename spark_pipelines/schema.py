"""The ``OrderCreated`` event: its Avro schema and plain (schemaless) Avro encoding.

Values are bare Avro binary, no framing, so Spark's ``from_avro`` decodes them
with the same schema (``ORDER_CREATED_JSON``).
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from typing import Any

import fastavro

ORDER_CREATED: dict[str, Any] = {
    "type": "record",
    "name": "OrderCreated",
    "namespace": "txbridge.demo",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "customer_id", "type": "string"},
        {
            "name": "customer_seq",
            "type": "long",
            "doc": "1-based position of the order in its customer's plan",
        },
        {"name": "amount_cents", "type": "long"},
        {"name": "created_ms", "type": "long", "doc": "producer wall clock when the event was built"},
    ],
}
ORDER_CREATED_JSON = json.dumps(ORDER_CREATED)
_PARSED = fastavro.parse_schema(ORDER_CREATED)


@dataclass(frozen=True)
class OrderCreated:
    """One order's event, as the three paths publish it."""

    order_id: str
    customer_id: str
    customer_seq: int
    amount_cents: int
    created_ms: int

    def key(self) -> bytes:
        """The Kafka key: the customer, so per-customer order is kept by partitioning."""
        return self.customer_id.encode()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def encode(event: OrderCreated | dict[str, Any]) -> bytes:
    """Schemaless Avro binary of an event."""
    record = event.to_dict() if isinstance(event, OrderCreated) else event
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, _PARSED, record)
    return buffer.getvalue()


def decode(data: bytes) -> OrderCreated:
    """Parse Avro binary written by :func:`encode`.

    Raises:
        ValueError: ``data`` is not an ``OrderCreated`` record.
    """
    try:
        record: Any = fastavro.schemaless_reader(io.BytesIO(data), _PARSED, None)
        return OrderCreated(**record)
    except Exception as exc:  # fastavro raises many types (EOFError, UnicodeDecodeError, ...)
        raise ValueError(f"not an OrderCreated Avro record: {exc}") from exc
