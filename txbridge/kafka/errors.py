"""confluent_kafka's errors, classified into txbridge's tree (:mod:`txbridge.errors`).

``KafkaError`` (an error code, with librdkafka's retriable / fatal / abort-the-transaction
flags) and ``KafkaException`` (what the clients raise, holding a ``KafkaError``) are
confluent_kafka's own classes, re-exported: code above this package catches them and compares
codes (``KafkaError.TOPIC_ALREADY_EXISTS``) through these names.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from txbridge.errors import KafkaOperationError, ProducerFencedError

__all__ = [
    "KafkaError",
    "KafkaException",
    "is_partition_eof",
    "is_unknown_partition",
    "is_unreleased_instance",
    "is_unsupported",
    "to_error",
]


def to_error(err: KafkaError | KafkaException | Exception, context: str) -> KafkaOperationError:
    """Translate a confluent_kafka error into txbridge's tree, keeping its classification."""
    kerr = err.args[0] if isinstance(err, KafkaException) and err.args else err
    if not isinstance(kerr, KafkaError):
        return KafkaOperationError(f"{context}: {err}")
    if kerr.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        return ProducerFencedError(f"{context}: fenced by a newer instance ({kerr.str()})")
    return KafkaOperationError(
        f"{context}: {kerr.str()} ({kerr.name()})",
        retriable=kerr.retriable(),
        # _FATAL: a call refused because the client already had a fatal error (produce() says
        # "Unable to produce message: Local: Fatal error" once a fence killed the producer).
        fatal=kerr.fatal() or kerr.code() == KafkaError._FATAL,
        txn_requires_abort=kerr.txn_requires_abort(),
        code=kerr.code(),
    )


def is_partition_eof(error: Any) -> bool:
    """True for the event a consumer made with ``enable_partition_eof`` sends at a partition's end."""
    return isinstance(error, KafkaError) and error.code() == KafkaError._PARTITION_EOF


def is_unknown_partition(error: Any) -> bool:
    """True for a client's refusal of a partition its metadata does not have (``_UNKNOWN_PARTITION``)."""
    if isinstance(error, KafkaOperationError):
        return error.code == KafkaError._UNKNOWN_PARTITION
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    return isinstance(error, KafkaError) and error.code() == KafkaError._UNKNOWN_PARTITION


def is_unreleased_instance(error: Any) -> bool:
    """True for the consumer protocol's refusal of a static member whose ``group.instance.id``
    another member of the group still holds (UNRELEASED_INSTANCE_ID). librdkafka reports it as
    a fatal error of its own, whose text alone names the broker's error."""
    if isinstance(error, KafkaError) and error.code() == KafkaError.UNRELEASED_INSTANCE_ID:
        return True
    return "instance id is still used" in str(error).lower()


def is_unsupported(error: Any) -> bool:
    """True for a broker's refusal of a request it does not know (too old for it)."""
    if isinstance(error, KafkaError) and error.code() in (
        KafkaError._UNSUPPORTED_FEATURE,
        KafkaError.UNSUPPORTED_VERSION,
    ):
        return True
    text = str(error).lower()
    return "unsupported" in text or "not supported" in text
