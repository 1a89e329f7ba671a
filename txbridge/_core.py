"""What the blocking and the asyncio producers share: settings, known topics, one open transaction.

:class:`OpenTransaction` writes records and drives the lifecycle; it never waits.
The producers wait on the handles their writer returns (futures when blocking,
acknowledgements batched onto the event loop with asyncio), so the protocol
steps live in one place.

A message the coordinator could not republish (its topic or partition does not
exist, it is above ``max_message_bytes``) is refused before its half record is
written: committed, it would only be quarantined. The producers keep the
:class:`TopicCatalog` fresh; :meth:`OpenTransaction.enqueue` applies the rules.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, TypeVar

from txbridge import limits, tracing, wire
from txbridge.errors import (
    ConfigurationError,
    MessageTooLargeError,
    TransactionStateError,
    UnknownTopicError,
)
from txbridge.serializers import BytesSerializer, Serializer
from txbridge.transaction import (
    HalfRecord,
    LocalTransaction,
    Message,
    RecordEncoder,
    TransactionLifecycle,
    TransactionResult,
    TxPhase,
    coerce_state,
    is_decisive,
    phase_of,
    serialize_key,
)
from txbridge.wire import Topics, TxState

logger = logging.getLogger(__name__)

H = TypeVar("H")


def default_instance_id() -> str:
    """``host-pid-random``: unique per process, readable in the registry."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ProducerSettings:
    """A producer's validated settings (no I/O). The secret is kept out of ``repr``."""

    bootstrap: str
    group: str
    secret: bytes = field(repr=False)
    namespace: str = wire.DEFAULT_NAMESPACE
    partitions: int | None = None  # None until start() reads the half topic's count
    instance_id: str = ""
    check_host: str = "127.0.0.1"
    check_port: int = 0
    serve_checks: bool = True
    advertised_url: str | None = None
    value_serializer: Serializer = field(default_factory=BytesSerializer)
    key_serializer: Serializer = field(default_factory=BytesSerializer)
    heartbeat_interval_s: float = 1.0
    max_message_bytes: int = limits.DEFAULT_MAX_MESSAGE_BYTES
    settle_unknown: bool | None = None
    #: as given (None: from the check function); once started, the source the halves say
    check_source: str | None = None
    # Not in repr: it holds the client settings, sasl.password and ssl.key.password among them.
    extra_config: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls, bootstrap: str, group: str, secret: bytes | str | None, **options: Any
    ) -> ProducerSettings:
        """Validate and normalise the constructor's arguments.

        Raises:
            ConfigurationError: a setting is missing or invalid; the message names it.
        """
        if not bootstrap:
            raise ConfigurationError(
                "no Kafka bootstrap address: pass bootstrap= (e.g. from KAFKA_BOOTSTRAP_SERVERS)"
            )
        if not isinstance(group, str) or not group.strip():
            raise ConfigurationError(
                "group must be a non-empty producer group name (who answers back-checks)"
            )
        if "/" in group:
            raise ConfigurationError(
                f"group {group!r} must not contain '/' (registry keys are group/instance)"
            )
        if not secret:
            raise ConfigurationError(
                "secret is required: the group's HMAC secret that signs back-checks "
                "(the same value the coordinator is configured with)"
            )
        raw_secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        _check_numbers(options)
        if not options.get("serve_checks", True) and not options.get("advertised_url"):
            raise ConfigurationError(
                "serve_checks=False needs advertised_url=: the URL where you mounted producer.check_app "
                "(path /txbridge/check), so the coordinator can reach it"
            )
        if not options.get("instance_id"):
            options["instance_id"] = default_instance_id()
        if "/" in options["instance_id"]:
            raise ConfigurationError("instance_id must not contain '/'")
        source = options.get("check_source")
        if source is not None and (not isinstance(source, str) or not source.isprintable() or not source):
            raise ConfigurationError(
                f"check_source must be a non-empty printable name, got {source!r}: "
                f"{wire.SOURCE_GROUP!r} when your check answers for every instance of the group, "
                f"{wire.SOURCE_INSTANCE!r} when only for this instance, or the name of the database it reads"
            )
        options["extra_config"] = dict(options.get("extra_config") or {})
        for name in ("value_serializer", "key_serializer"):
            if options.get(name) is None:
                options[name] = BytesSerializer()
            elif not callable(getattr(options[name], "serialize", None)):
                raise ConfigurationError(f"{name} must have a serialize(value) -> bytes method")
        return cls(bootstrap=bootstrap, group=group, secret=raw_secret, **options)

    @property
    def topics(self) -> Topics:
        return Topics(self.namespace)


def _check_numbers(options: Mapping[str, Any]) -> None:
    partitions = options.get("partitions")
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise ConfigurationError(f"partitions must be a positive integer, got {partitions!r}")
    if options.get("heartbeat_interval_s", 1.0) <= 0:
        raise ConfigurationError("heartbeat_interval_s must be positive")
    max_bytes = options.get("max_message_bytes", limits.DEFAULT_MAX_MESSAGE_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigurationError(
            "max_message_bytes must be a positive integer, the coordinator's max_message_bytes "
            f"(default {limits.DEFAULT_MAX_MESSAGE_BYTES}), got {max_bytes!r}"
        )


#: How long a listing that showed a topic is trusted (a missing topic is asked again at every send).
TOPIC_CACHE_S = 10.0


class TopicCatalog:
    """Partition counts of the cluster's topics, from the last full metadata listing.

    A topic in the listing stays known for ``ttl_s``; a topic missing from it is
    never trusted as missing for a later send: that send lists again, so creating
    the topic fixes things without restarting the producer.

    Args:
        ttl_s: how long a listing is trusted for the topics it showed.
    """

    def __init__(self, ttl_s: float = TOPIC_CACHE_S) -> None:
        self.ttl_s = ttl_s
        self._counts: Mapping[str, int] = {}
        self._listed_at = float("-inf")  # when the last listing was requested
        self._trusted_until = float("-inf")  # until when the topics it showed are trusted

    def stale(self, messages: Iterable[Message], asked_at: float) -> bool:
        """True when the topics of ``messages`` must be listed again for a send begun at ``asked_at``.

        A listing requested at or after ``asked_at`` answers for every topic (another thread's
        listing too); an older one only for the topics it showed, while it is trusted.
        """
        if self._listed_at >= asked_at:
            return False
        if asked_at > self._trusted_until:
            return True
        counts = self._counts
        return any(msg.topic not in counts for msg in messages)

    def known(self, messages: Iterable[Message]) -> bool:
        """True when every topic of ``messages`` was in the last listing, however old."""
        counts = self._counts
        return all(msg.topic in counts for msg in messages)

    def update(self, counts: Mapping[str, int | None], listed_at: float) -> None:
        """Replace the counts with a listing requested at ``listed_at`` (``None``: an unusable topic)."""
        self._counts = {name: count for name, count in counts.items() if count is not None}
        self._listed_at = listed_at
        self._trusted_until = listed_at + self.ttl_s

    def keep(self, now: float) -> None:
        """A listing failed: trust the last one's topics for another ``ttl_s`` instead of asking
        again at every send (each would wait out the metadata timeout)."""
        self._trusted_until = now + self.ttl_s

    def partitions(self, topic: str) -> int | None:
        """``topic``'s partition count in the last listing, None when it was not there."""
        return self._counts.get(topic)


#: How a producer writes one record: ``write(topic, partition, key, value, headers)``
#: enqueues it and returns a handle to wait on (a future, an acknowledgement...).
RecordWriter = Callable[[str, int, bytes, bytes | None, list[tuple[str, bytes]] | None], H]


class TransactionFactory(Generic[H]):
    """What every transaction of one producer shares: settings, encoder, topics, the writer.

    Computed once per producer, so opening a transaction allocates only its own state.
    """

    def __init__(self, settings: ProducerSettings, write: RecordWriter[H], catalog: TopicCatalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self.max_message_bytes = settings.max_message_bytes
        self.encoder = RecordEncoder(
            settings.group,
            settings.instance_id,
            settings.key_serializer,
            settings.value_serializer,
            settings.check_source,
        )
        topics = settings.topics
        self.half_topic = topics.half
        self.op_topic = topics.op
        self.partitions = settings.partitions
        self.write = write

    def open(self, order_key: bytes | None = None) -> OpenTransaction[H]:
        return OpenTransaction(self, order_key)

    def admit(
        self,
        tx: bytes,
        messages: Sequence[Message],
        halves: Sequence[HalfRecord],
        trace_headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Refuse what the coordinator would quarantine once committed (the rules of its republisher).

        Raises:
            UnknownTopicError: a topic, or an explicit partition, is not in the catalog.
            MessageTooLargeError: a message is above ``max_message_bytes`` as republished.
        """
        catalog, limit = self.catalog, self.max_message_bytes
        # The trace headers are republished with the message (see RecordEncoder.halves).
        traced = sum(len(name) + len(raw) for name, raw in trace_headers)
        for msg, half in zip(messages, halves, strict=True):
            size = limits.republished_size(tx, half.message_key, half.value, msg.header_pairs)
            if traced and not tracing.has_traceparent(msg.header_pairs):
                size += traced
            if size > limit:
                raise MessageTooLargeError(
                    f"a message to {msg.topic!r} is {size} bytes as the coordinator republishes it "
                    f"(key + value + headers + {limits.RECORD_OVERHEAD}), above max_message_bytes={limit}: "
                    "raise max_message_bytes on the coordinator and the producer, or send a smaller "
                    f"message. {_NOT_WRITTEN}",
                    topic=msg.topic,
                )
            count = catalog.partitions(msg.topic)
            if count is None:
                raise UnknownTopicError(
                    f"topic {msg.topic!r} does not exist at {self.settings.bootstrap}: create topic "
                    f"{msg.topic} (txbridge does not rely on the broker creating topics), then send again. "
                    f"{_NOT_WRITTEN}",
                    topic=msg.topic,
                )
            if msg.partition is not None and msg.partition >= count:
                raise UnknownTopicError(
                    f"topic {msg.topic!r} has no partition {msg.partition} (it has {count}): send to a "
                    f"partition below {count}, or add partitions to topic {msg.topic}. {_NOT_WRITTEN}",
                    topic=msg.topic,
                )


_NOT_WRITTEN = "This message was not written and no local transaction ran for it."


@lru_cache(maxsize=8192)
def _half_partition(order_key: bytes, partitions: int) -> int:
    # murmur2 is pure Python: order keys repeat (customers, accounts), so remember the answer.
    return wire.half_partition(order_key, partitions)


class OpenTransaction(Generic[H]):
    """One transaction in flight: its id, partition, messages, phase and unacknowledged records.

    ``H`` is the producer's handle on a written record (see :data:`RecordWriter`).
    """

    __slots__ = (
        "_factory",
        "_order_key",
        "_pending",
        "half_error",
        "lifecycle",
        "messages",
        "partition",
        "trace",
        "tx_id",
    )

    def __init__(self, factory: TransactionFactory[H], order_key: bytes | None = None) -> None:
        self._factory = factory
        self.tx_id = wire.new_tx_id()
        self.lifecycle = TransactionLifecycle(self.tx_id)
        self.partition: int | None = None
        self.messages: list[Message] = []
        self.half_error: BaseException | None = None
        self._order_key = order_key
        self._pending: list[H] = []
        #: The transaction's span (None unless the application records traces: txbridge.tracing).
        self.trace = tracing.begin_transaction(self.tx_id, factory.settings.group)

    @property
    def settings(self) -> ProducerSettings:
        return self._factory.settings

    @property
    def phase(self) -> TxPhase:
        return self.lifecycle.phase

    def local_view(self) -> LocalTransaction:
        return LocalTransaction(
            tx_id=self.tx_id, group=self._factory.settings.group, messages=tuple(self.messages)
        )

    def enqueue(self, messages: Sequence[Message]) -> None:
        """Write ``messages`` as half records (not awaited: see :meth:`take_pending`).

        Raises:
            SerializationError: a key or value cannot be serialized; nothing was written.
            MessageRejectedError: the coordinator could not republish a message (see
                :meth:`TransactionFactory.admit`); nothing was written.
            TransactionStateError: the transaction was already decided, or a half write failed.
        """
        if not messages:
            raise ValueError("a transaction needs at least one message")
        if self.half_error is not None:
            raise TransactionStateError(f"transaction {self.tx_id} already failed to write a half record")
        if not self.lifecycle.can(TxPhase.SENDING):
            raise TransactionStateError(f"transaction {self.tx_id} is {self.phase}: no more messages")
        factory = self._factory
        trace_headers = self.trace.headers if self.trace is not None else ()
        try:
            halves = factory.encoder.halves(self.tx_id, messages, len(self.messages), trace_headers)
            factory.admit(halves[0].key, messages, halves, trace_headers)
        except Exception as exc:
            if self.trace is not None and not self.messages:  # nothing written: no op record will end it
                self.trace.fail(exc)
                self.trace = None
            raise
        partition = self.partition
        if partition is None:
            order_key = self._order_key or halves[0].message_key or halves[0].key
            if factory.partitions is None:  # start() reads it before any transaction opens
                raise TransactionStateError("the half topic's partition count is unknown: start() first")
            partition = self.partition = _half_partition(order_key, factory.partitions)
        self.lifecycle.advance(TxPhase.SENDING)
        self.messages.extend(messages)
        write, topic = factory.write, factory.half_topic
        for half in halves:
            self._pending.append(write(topic, partition, half.key, half.value, half.headers))

    def take_pending(self) -> list[H]:
        """The half records not yet awaited (the caller waits, then calls :meth:`settle`)."""
        pending, self._pending = self._pending, []
        return pending

    def settle(self, failures: Sequence[BaseException]) -> None:
        """Record the outcome of the awaited half records: PREPARED, or remember the failure."""
        if failures:
            self.half_error = self.half_error or failures[0]
        elif self.lifecycle.phase is TxPhase.SENDING and not self._pending:
            self.lifecycle.advance(TxPhase.PREPARED)
        else:
            return
        if self.trace is not None:
            self.trace.halves_acknowledged(failures)

    def decide(self, state: TxState, *, reason: str = "") -> H | None:
        """Move to the final phase and write the op record (COMMIT/ROLLBACK; nothing for UNKNOWN
        or when no half record was ever written)."""
        if state is TxState.COMMIT and self.lifecycle.phase is not TxPhase.PREPARED and self.messages:
            raise TransactionStateError(
                f"transaction {self.tx_id} cannot commit: its half records are not all acknowledged"
            )
        self.lifecycle.advance(phase_of(state))
        if state is TxState.UNKNOWN or self.partition is None:
            return None
        factory = self._factory
        key, value = factory.encoder.op(
            self.tx_id, state, count=len(self.messages) if state is TxState.COMMIT else None, reason=reason
        )
        return factory.write(factory.op_topic, self.partition, key, value, None)

    def result(
        self, state: TxState, error: BaseException | None, op_failures: Sequence[BaseException]
    ) -> TransactionResult:
        return TransactionResult(
            tx_id=self.tx_id,
            state=state,
            error=error or (op_failures[0] if op_failures else None),
            partition=self.partition,
            op_acknowledged=state is not TxState.UNKNOWN and self.partition is not None and not op_failures,
        )


def order_key_bytes(settings: ProducerSettings, order_key: Any) -> bytes | None:
    """An explicit order key as bytes (serialized like a message key when it is not bytes)."""
    if order_key is None or isinstance(order_key, bytes):
        return order_key
    return serialize_key(settings.key_serializer, order_key)


def normalise_messages(message: Message | Sequence[Message]) -> list[Message]:
    if isinstance(message, Message):
        return [message]
    messages = list(message)
    if not messages or not all(isinstance(m, Message) for m in messages):
        raise TypeError(
            f"expected a Message or a non-empty sequence of Message, got {type(message).__name__}"
        )
    return messages


HALF_NOT_ACKNOWLEDGED = "half record not acknowledged"


def half_failure(tx: OpenTransaction[Any]) -> tuple[TxState, BaseException | None, str]:
    """What a transaction whose half record failed writes: ROLLBACK, with the error (logged)."""
    logger.warning(
        "transaction %s: a half record was not acknowledged (%s); rolled back, not run locally",
        tx.tx_id,
        tx.half_error,
    )
    return TxState.ROLLBACK, tx.half_error, HALF_NOT_ACKNOWLEDGED


def op_outcome(
    tx: OpenTransaction[Any],
    state: TxState,
    error: BaseException | None,
    op_failures: Sequence[BaseException],
) -> TransactionResult:
    """The result once the op record was awaited; a failed op record is logged (the check decides)."""
    if op_failures:
        logger.warning(
            "transaction %s: the %s op record was not acknowledged (%s); the back-check will decide",
            tx.tx_id,
            state,
            op_failures[0],
        )
    result = tx.result(state, error, op_failures)
    if tx.trace is not None:
        tx.trace.end(state, result.error, messages=len(tx.messages), op_acknowledged=result.op_acknowledged)
    return result


def local_failure(txn: LocalTransaction, exc: Exception) -> tuple[TxState, BaseException]:
    """RocketMQ's rule: a local transaction that raised is UNKNOWN (the back-check decides)."""
    logger.warning(
        "local transaction %s raised %s: leaving it UNKNOWN for the back-check", txn.tx_id, type(exc).__name__
    )
    return TxState.UNKNOWN, exc


def checked_answer(txn: LocalTransaction, answer: Any) -> TxState:
    """The local transaction's answer as a TxState; anything else is UNKNOWN (logged), never COMMIT."""
    if answer is TxState.COMMIT or answer is TxState.ROLLBACK:
        return answer
    state = coerce_state(answer)
    if state is TxState.RUNNING:  # a back-check answer; as an outcome it leaves the decision open
        return TxState.UNKNOWN
    if state is TxState.UNKNOWN and answer is not TxState.UNKNOWN:
        logger.warning("local transaction %s answered %r, not a TxState: UNKNOWN", txn.tx_id, answer)
    return state


class TransactionBlock(Generic[H]):
    """What ``with producer.transaction()`` and ``async with ...`` share: state and exit rules.

    The subclasses only wait (blocking or awaited); the decision on leaving the block is here:
    a clean exit writes the outcome (COMMIT by default), unless a half record failed
    (ROLLBACK, and its error is raised); an exception writes ROLLBACK.

    Attributes:
        result: the :class:`TransactionResult`, set when the block exits.
    """

    def __init__(self, tx: OpenTransaction[H]) -> None:
        self._tx = tx
        self._outcome = TxState.COMMIT
        self.result: TransactionResult | None = None
        # Entered and left with the block: the transaction's span is current inside it.
        self._traced = tracing.current(tx.trace)

    @property
    def tx_id(self) -> str:
        return self._tx.tx_id

    @property
    def partition(self) -> int | None:
        """The half/op partition (known after the first send)."""
        return self._tx.partition

    @property
    def local(self) -> LocalTransaction:
        return self._tx.local_view()

    def set_outcome(self, state: TxState) -> None:
        """What a clean exit writes: COMMIT (default), ROLLBACK, or UNKNOWN (left to the back-check).

        Raises:
            ValueError: ``state`` is RUNNING, which only a back-check answers.
        """
        outcome = TxState(state)
        if outcome is TxState.RUNNING:
            raise ValueError("RUNNING is a back-check answer, not an outcome: use UNKNOWN")
        self._outcome = outcome

    def _settled(self, failures: Sequence[BaseException]) -> None:
        """Settle awaited half records; raise the half failure (the block can only roll back)."""
        self._tx.settle(failures)
        if self._tx.half_error is not None:
            raise self._tx.half_error

    def _exit_decision(
        self, exc: BaseException | None
    ) -> tuple[TxState, BaseException | None, str, BaseException | None]:
        """``(state, error, reason, to_raise)`` once every half record is settled."""
        if exc is not None:
            return TxState.ROLLBACK, exc, f"exception in the transaction block: {type(exc).__name__}", None
        if self._tx.half_error is not None:
            state, error, reason = half_failure(self._tx)
            return state, error, reason, self._tx.half_error
        return self._outcome, None, "", None


#: After a local transaction ends UNKNOWN, a producer whose check is decisive asks it at once,
#: then after these waits, before it leaves the outcome to the coordinator's back-check.
SETTLE_WAITS_S = (0.0, 0.05, 0.25)
SETTLED_REASON = "UNKNOWN settled by the producer's own decisive check"


def settles_unknown(settings: ProducerSettings, check: Callable[..., Any]) -> bool:
    """Whether the producer asks ``check`` itself after an UNKNOWN: ``settle_unknown`` when set,
    else only for a check marked :func:`~txbridge.transaction.decisive` (the barrier's)."""
    return settings.settle_unknown if settings.settle_unknown is not None else is_decisive(check)


def settle_unknown(check: Callable[..., Any], txn: LocalTransaction) -> TxState:
    """Ask ``check`` until it decides (see :data:`SETTLE_WAITS_S`); UNKNOWN when it never does."""
    for wait in SETTLE_WAITS_S:
        time.sleep(wait)
        try:
            state = coerce_state(check(txn))
        except Exception as exc:  # a failing check leaves it to the back-check, like an UNKNOWN
            logger.warning("own check of %s raised %s", txn.tx_id, type(exc).__name__)
            continue
        if state is TxState.COMMIT or state is TxState.ROLLBACK:
            return state
    return TxState.UNKNOWN


async def settle_unknown_async(check: Callable[..., Any], txn: LocalTransaction) -> TxState:
    """:func:`settle_unknown` for the asyncio producer: a plain check runs in a worker thread."""
    for wait in SETTLE_WAITS_S:
        await asyncio.sleep(wait)
        try:
            if inspect.iscoroutinefunction(check):
                answer = await check(txn)
            else:
                answer = await asyncio.to_thread(check, txn)
                if inspect.isawaitable(answer):
                    answer = await answer
            state = coerce_state(answer)
        except Exception as exc:
            logger.warning("own check of %s raised %s", txn.tx_id, type(exc).__name__)
            continue
        if state is TxState.COMMIT or state is TxState.ROLLBACK:
            return state
    return TxState.UNKNOWN
