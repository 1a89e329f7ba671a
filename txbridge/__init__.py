"""txbridge: RocketMQ-style transactional messages on an existing Apache Kafka."""

from txbridge.errors import TxBridgeError

__version__ = "0.1.0"

__all__ = ["TxBridgeError", "__version__"]
