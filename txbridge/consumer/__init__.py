"""RocketMQ consumer semantics on Kafka: orderly and concurrent consumers, tags, retries, dead letters.

See ``docs/consumers.md``.
"""

from txbridge.consumer.concurrent import ConcurrentConsumer
from txbridge.consumer.model import (
    ConcurrentContext,
    ConsumeConcurrentlyStatus,
    ConsumedMessage,
    ConsumeOrderlyStatus,
    OrderlyContext,
)
from txbridge.consumer.orderly import OrderlyConsumer
from txbridge.consumer.retry import ROCKETMQ_DELAYS_S, RetryPolicy
from txbridge.consumer.tags import Subscription, parse_subscription

__all__ = [
    "ROCKETMQ_DELAYS_S",
    "ConcurrentConsumer",
    "ConcurrentContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyStatus",
    "ConsumedMessage",
    "OrderlyConsumer",
    "OrderlyContext",
    "RetryPolicy",
    "Subscription",
    "parse_subscription",
]
