"""txbridge: RocketMQ-style transactional messages on an existing Apache Kafka.

The public names load on first use (PEP 562): the coordinator, the CLI and the tools import
``txbridge.errors`` or ``txbridge.wire`` without paying for the producers, the check server
and the barrier, which would slow every coordinator restart.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txbridge.aio import AsyncTransactionProducer
    from txbridge.barrier import SqlAlchemyBarrier, SqliteBarrier
    from txbridge.errors import TxBridgeError
    from txbridge.producer import TransactionProducer
    from txbridge.producer.settings import ProducerOptions
    from txbridge.serializers import AvroSerializer, BytesSerializer, StringSerializer
    from txbridge.transaction import (
        LocalTransaction,
        Message,
        TransactionListener,
        TransactionResult,
        decisive,
    )
    from txbridge.wire import TxState

__version__ = "0.1.0"

_WHERE = {
    "AsyncTransactionProducer": "txbridge.aio",
    "AvroSerializer": "txbridge.serializers",
    "BytesSerializer": "txbridge.serializers",
    "LocalTransaction": "txbridge.transaction",
    "Message": "txbridge.transaction",
    "ProducerOptions": "txbridge.producer.settings",
    "SqlAlchemyBarrier": "txbridge.barrier",
    "SqliteBarrier": "txbridge.barrier",
    "StringSerializer": "txbridge.serializers",
    "TransactionListener": "txbridge.transaction",
    "TransactionProducer": "txbridge.producer",
    "TransactionResult": "txbridge.transaction",
    "TxBridgeError": "txbridge.errors",
    "TxState": "txbridge.wire",
    "decisive": "txbridge.transaction",
}

__all__ = [
    "AsyncTransactionProducer",
    "AvroSerializer",
    "BytesSerializer",
    "LocalTransaction",
    "Message",
    "ProducerOptions",
    "SqlAlchemyBarrier",
    "SqliteBarrier",
    "StringSerializer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionResult",
    "TxBridgeError",
    "TxState",
    "__version__",
    "decisive",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'txbridge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
