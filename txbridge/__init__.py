"""txbridge: RocketMQ-style transactional messages on an existing Apache Kafka."""

from txbridge.aio import AsyncTransactionProducer
from txbridge.barrier import SqlAlchemyBarrier, SqliteBarrier
from txbridge.errors import TxBridgeError
from txbridge.producer import TransactionProducer
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

__all__ = [
    "AsyncTransactionProducer",
    "AvroSerializer",
    "BytesSerializer",
    "LocalTransaction",
    "Message",
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
