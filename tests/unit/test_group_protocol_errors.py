"""The consumer group protocol's refusals, told apart from other client failures."""

from __future__ import annotations

from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import KafkaError


def test_a_held_instance_id_is_told_apart() -> None:
    assert kafka.is_unreleased_instance(KafkaError(KafkaError.UNRELEASED_INSTANCE_ID))
    # librdkafka reports it as a fatal error of its own: only the text names the broker's error
    fatal = KafkaOperationError(
        "consuming half and op: Fatal error: Broker: The instance ID is still used by another "
        "member in the consumer group: ConsumerGroupHeartbeat fatal error (_FATAL)"
    )
    assert kafka.is_unreleased_instance(fatal)
    other = KafkaOperationError("Broker: Specified group generation id is not valid")
    assert not kafka.is_unreleased_instance(other)


def test_an_unsupported_request_is_told_apart() -> None:
    assert kafka.is_unsupported(KafkaError(KafkaError.UNSUPPORTED_VERSION))
    assert kafka.is_unsupported(KafkaError(KafkaError._UNSUPPORTED_FEATURE))
    assert not kafka.is_unsupported(KafkaError(KafkaError._FENCED))
