"""Every error txbridge raises.

The tree::

    TxBridgeError
    ├── ConfigurationError       misconfiguration; the message says what to change
    ├── SetupError               a prerequisite (JDK, Maven, jars) is missing or failed
    ├── BrokerError              the local Kafka broker could not be started or stopped
    ├── KafkaUnavailableError    nothing answers at a bootstrap address        (retriable)
    ├── KafkaOperationError      a Kafka call failed; ``retriable`` says if it may be retried
    │   └── ProducerFencedError  another instance took over the transactional id (fatal)
    ├── WireFormatError          a record does not follow docs/wire-format.md
    ├── CheckBackError           a back-check request or answer is unusable
    │   └── SignatureError       a back-check request is unsigned, badly signed or stale
    ├── TransactionStateError    a transition the transaction state machine forbids
    ├── SerializationError       a message key or value cannot be serialized
    ├── MessageRejectedError     refused before its half record: the coordinator could not republish it
    │   ├── UnknownTopicError    its topic, or its explicit partition, does not exist
    │   └── MessageTooLargeError it is above max_message_bytes
    └── BarrierConflictError     the barrier already holds a decision for this tx id (no late commit)

Callers catch :class:`TxBridgeError`; ``retriable`` on an instance tells whether
the same call may succeed later.
"""

from __future__ import annotations


class TxBridgeError(Exception):
    """Root of every txbridge error."""

    retriable: bool = False


class ConfigurationError(TxBridgeError):
    """A setting is missing or wrong; the message names the setting to change."""


class SetupError(TxBridgeError):
    """A prerequisite of the local tooling (JDK, Maven, jars) is missing or failed."""


class BrokerError(TxBridgeError):
    """The local Kafka broker failed to start or stop."""


class KafkaUnavailableError(TxBridgeError):
    """No Kafka broker answers at the configured bootstrap address."""

    retriable = True


class KafkaOperationError(TxBridgeError):
    """A Kafka client call failed.

    Attributes:
        retriable: True when librdkafka classifies the underlying error as retriable.
        fatal: True when the client instance can no longer be used.
        txn_requires_abort: True when the open Kafka transaction must be aborted.
        code: librdkafka's error code (``confluent_kafka.KafkaError``), when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        retriable: bool = False,
        fatal: bool = False,
        txn_requires_abort: bool = False,
        code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.fatal = fatal
        self.txn_requires_abort = txn_requires_abort
        self.code = code


class ProducerFencedError(KafkaOperationError):
    """A newer instance with the same transactional id fenced this one (a zombie)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fatal=True)


class WireFormatError(TxBridgeError):
    """A record does not follow the txbridge wire format."""


class CheckBackError(TxBridgeError):
    """A back-check request or answer is unusable."""


class SignatureError(CheckBackError):
    """A back-check request is unsigned, badly signed or stale."""


class TransactionStateError(TxBridgeError):
    """A transaction was asked for a transition its state machine forbids."""


class SerializationError(TxBridgeError):
    """A message key or value cannot be turned into bytes (or back) by its serializer."""


class MessageRejectedError(TxBridgeError):
    """The producer refused a message the coordinator could not republish once committed.

    Raised before the message's half record is written and before the local
    transaction runs, so nothing commits that would then be quarantined. The
    message says what to change.

    Attributes:
        topic: the message's destination topic.
    """

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class UnknownTopicError(MessageRejectedError):
    """The message's topic, or its explicit partition, does not exist: create it, then send again."""


class MessageTooLargeError(MessageRejectedError):
    """The message is above ``max_message_bytes`` as the coordinator measures it (``txbridge.limits``)."""


class BarrierConflictError(TxBridgeError):
    """The barrier already holds a decision for this tx id.

    Raised by ``local_transaction`` when a back-check has already rolled the
    transaction back (or it was committed before): the local commit must not
    happen, and it did not.
    """
