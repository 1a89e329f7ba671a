"""One producer transaction: its phase, id, partition, messages and records in flight.

:class:`ProducerTransaction` holds the whole state of one transaction and is the
only place it changes. Its phase moves through one table
(:attr:`ProducerTransaction.TRANSITIONS`) by one guarded setter
(:meth:`ProducerTransaction.advance`), so a transaction that would end twice, or
send after its op record, raises instead of writing. It writes records and never
waits: the blocking :class:`~txbridge.producer.Transaction` and the asyncio
:class:`~txbridge.aio.AsyncTransaction` are thin subclasses that wait on the
handles its writer returns (futures, or acknowledgements batched onto the event loop).

Phases and allowed transitions::

    NEW ──send──> SENDING ──halves acked──> PREPARED ──> COMMITTED | ROLLED_BACK | UNKNOWN
     │               │                         │
     │               └──────> ROLLED_BACK      └──send──> SENDING (another message, context form)
     ├──────────────────────> ROLLED_BACK  (exception before any message)
     └──────────────────────> COMMITTED    (empty transaction: nothing is written)

A message the coordinator could not republish (its topic or partition does not
exist, it is above ``max_message_bytes``) is refused before its half record is
written: committed, it would only be quarantined. The producers keep the
:class:`~txbridge.producer.catalog.TopicCatalog` fresh; :meth:`ProducerTransaction.enqueue`
applies the rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from enum import StrEnum
from functools import lru_cache
from typing import Any, ClassVar, Generic, TypeVar

from txbridge import limits, tracing, wire
from txbridge.errors import MessageTooLargeError, TransactionStateError, UnknownTopicError
from txbridge.producer.catalog import TopicCatalog
from txbridge.producer.records import Decision, HalfRecord, serialize_key
from txbridge.producer.settings import ProducerSettings
from txbridge.transaction import LocalTransaction, Message, TransactionResult
from txbridge.wire import TxState

logger = logging.getLogger(__name__)

H = TypeVar("H")

#: How a producer writes one record: ``write(topic, partition, key, value, headers)``
#: enqueues it and returns a handle to wait on (a future, an acknowledgement...).
RecordWriter = Callable[[str, int, bytes, bytes | None, list[tuple[str, bytes]] | None], H]


class TxPhase(StrEnum):
    NEW = "NEW"
    SENDING = "SENDING"
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    UNKNOWN = "UNKNOWN"


_FINAL_PHASE = {
    TxState.COMMIT: TxPhase.COMMITTED,
    TxState.ROLLBACK: TxPhase.ROLLED_BACK,
    TxState.UNKNOWN: TxPhase.UNKNOWN,
}

_NOT_WRITTEN = "This message was not written and no local transaction ran for it."
HALF_NOT_ACKNOWLEDGED = "half record not acknowledged"


@lru_cache(maxsize=8192)
def _half_partition(order_key: bytes, partitions: int) -> int:
    # murmur2 is pure Python: order keys repeat (customers, accounts), so remember the answer.
    return wire.half_partition(order_key, partitions)


class ProducerTransaction(Generic[H]):
    """One transaction in flight: its phase, id, partition, messages and unacknowledged records.

    ``H`` is the producer's handle on a written record (see :data:`RecordWriter`). The
    decision on leaving a ``with`` block is here too: a clean exit writes the outcome
    (COMMIT by default) unless a half record failed (ROLLBACK, and its error is raised);
    an exception writes ROLLBACK.

    Args:
        settings: the started producer's settings (the half topic's partition count is known).
        catalog: the producer's topic listing, for the refusals.
        write: writes one record and returns its handle.
        order_key: picks the half partition (default: the first message's key, else the tx id).

    Attributes:
        result: the :class:`~txbridge.TransactionResult`, set once the op record was awaited.
    """

    #: The allowed transitions; a phase with none is final.
    TRANSITIONS: ClassVar[Mapping[TxPhase, frozenset[TxPhase]]] = {
        TxPhase.NEW: frozenset({TxPhase.SENDING, TxPhase.ROLLED_BACK, TxPhase.COMMITTED}),
        TxPhase.SENDING: frozenset({TxPhase.PREPARED, TxPhase.ROLLED_BACK}),
        TxPhase.PREPARED: frozenset(
            {TxPhase.SENDING, TxPhase.COMMITTED, TxPhase.ROLLED_BACK, TxPhase.UNKNOWN}
        ),
        TxPhase.COMMITTED: frozenset(),
        TxPhase.ROLLED_BACK: frozenset(),
        TxPhase.UNKNOWN: frozenset(),
    }

    __slots__ = (
        "_catalog",
        "_order_key",
        "_outcome",
        "_pending",
        "_traced",
        "_write",
        "half_error",
        "history",
        "messages",
        "partition",
        "phase",
        "result",
        "settings",
        "trace",
        "tx_id",
    )

    #: Set when a ``with`` block is entered: the transaction's span is current inside it.
    _traced: AbstractContextManager[Any]

    def __init__(
        self,
        settings: ProducerSettings,
        catalog: TopicCatalog,
        write: RecordWriter[H],
        order_key: bytes | None = None,
    ) -> None:
        self.settings = settings
        self._catalog = catalog
        self._write = write
        self._order_key = order_key
        self.tx_id = wire.new_tx_id()
        self.phase = TxPhase.NEW
        self.history: list[TxPhase] = []
        self.partition: int | None = None
        self.messages: list[Message] = []
        self.half_error: BaseException | None = None
        self._pending: list[H] = []
        self._outcome = TxState.COMMIT
        self.result: TransactionResult | None = None
        #: The transaction's span (None unless the application records traces: txbridge.tracing).
        self.trace = tracing.begin_transaction(self.tx_id, settings.group)

    # ---------------------------------------------------------------- the phase

    def can(self, target: TxPhase) -> bool:
        return target in self.TRANSITIONS[self.phase]

    def advance(self, target: TxPhase) -> None:
        """Move to ``target``: the one place the phase changes.

        Raises:
            TransactionStateError: the table forbids it (e.g. send after the decision).
        """
        if target not in self.TRANSITIONS[self.phase]:
            raise TransactionStateError(f"transaction {self.tx_id} cannot go from {self.phase} to {target}")
        self.history.append(self.phase)
        self.phase = target

    @property
    def finished(self) -> bool:
        return not self.TRANSITIONS[self.phase]

    # ---------------------------------------------------------------- what the application sees

    @property
    def local(self) -> LocalTransaction:
        """What the local-transaction and check callbacks see of this transaction."""
        return LocalTransaction(tx_id=self.tx_id, group=self.settings.group, messages=tuple(self.messages))

    def set_outcome(self, state: TxState) -> None:
        """What a clean exit writes: COMMIT (default), ROLLBACK, or UNKNOWN (left to the back-check).

        Raises:
            ValueError: ``state`` is RUNNING, which only a back-check answers.
        """
        outcome = TxState(state)
        if outcome is TxState.RUNNING:
            raise ValueError("RUNNING is a back-check answer, not an outcome: use UNKNOWN")
        self._outcome = outcome

    # ---------------------------------------------------------------- half records

    def enqueue(self, messages: Sequence[Message]) -> None:
        """Write ``messages`` as half records (not awaited: see :meth:`take_pending`).

        Raises:
            SerializationError: a key or value cannot be serialized; nothing was written.
            MessageRejectedError: the coordinator could not republish a message (see
                :meth:`_admit`); nothing was written.
            TransactionStateError: the transaction was already decided, or a half write failed.
        """
        if not messages:
            raise ValueError("a transaction needs at least one message")
        if self.half_error is not None:
            raise TransactionStateError(f"transaction {self.tx_id} already failed to write a half record")
        if not self.can(TxPhase.SENDING):
            raise TransactionStateError(f"transaction {self.tx_id} is {self.phase}: no more messages")
        settings = self.settings
        trace_headers = self.trace.headers if self.trace is not None else ()
        try:
            halves = settings.encoder.halves(self.tx_id, messages, len(self.messages), trace_headers)
            self._admit(halves[0].key, messages, halves, trace_headers)
        except Exception as exc:
            if self.trace is not None and not self.messages:  # nothing written: no op record will end it
                self.trace.fail(exc)
                self.trace = None
            raise
        partition = self.partition
        if partition is None:
            order_key = self._order_key or halves[0].message_key or halves[0].key
            if settings.partitions is None:  # start() reads it before any transaction opens
                raise TransactionStateError("the half topic's partition count is unknown: start() first")
            partition = self.partition = _half_partition(order_key, settings.partitions)
        self.advance(TxPhase.SENDING)
        self.messages.extend(messages)
        write, topic = self._write, settings.half_topic
        for half in halves:
            self._pending.append(write(topic, partition, half.key, half.value, half.headers))

    def _admit(
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
        catalog, limit = self._catalog, self.settings.max_message_bytes
        # The trace headers are republished with the message (see RecordEncoder.halves).
        traced = sum(len(name) + len(raw) for name, raw in trace_headers) if trace_headers else 0
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

    def take_pending(self) -> list[H]:
        """The half records not yet awaited (the caller waits, then calls :meth:`settle`)."""
        pending, self._pending = self._pending, []
        return pending

    def settle(self, failures: Sequence[BaseException]) -> None:
        """Record the outcome of the awaited half records: PREPARED, or remember the failure."""
        if failures:
            self.half_error = self.half_error or failures[0]
        elif self.phase is TxPhase.SENDING and not self._pending:
            self.advance(TxPhase.PREPARED)
        else:
            return
        if self.trace is not None:
            self.trace.halves_acknowledged(failures)

    def settle_or_raise(self, failures: Sequence[BaseException]) -> None:
        """:meth:`settle`, then raise the half failure (the transaction can only roll back)."""
        self.settle(failures)
        if self.half_error is not None:
            raise self.half_error

    # ---------------------------------------------------------------- the decision

    def half_failure(self) -> tuple[TxState, BaseException | None, str]:
        """What a transaction whose half record failed writes: ROLLBACK, with the error (logged)."""
        logger.warning(
            "transaction %s: a half record was not acknowledged (%s); rolled back, not run locally",
            self.tx_id,
            self.half_error,
        )
        return TxState.ROLLBACK, self.half_error, HALF_NOT_ACKNOWLEDGED

    def exit_decision(
        self, exc: BaseException | None
    ) -> tuple[TxState, BaseException | None, str, BaseException | None]:
        """``(state, error, reason, to_raise)`` on leaving a ``with`` block, every half record settled."""
        if exc is not None:
            return TxState.ROLLBACK, exc, f"exception in the transaction block: {type(exc).__name__}", None
        if self.half_error is not None:
            state, error, reason = self.half_failure()
            return state, error, reason, self.half_error
        return self._outcome, None, "", None

    def decide(self, state: TxState, *, reason: str = "") -> H | None:
        """Move to the final phase and write the op record (COMMIT/ROLLBACK; nothing for UNKNOWN
        or when no half record was ever written)."""
        decision = self.conclude(state, reason=reason)
        if decision is None or self.partition is None:
            return None
        settings = self.settings
        key, value = settings.encoder.decision(decision)
        return self._write(settings.op_topic, self.partition, key, value, None)

    def conclude(self, state: TxState, *, reason: str = "") -> Decision | None:
        """Move to the final phase; the decision its op record carries (None: no op record, for
        UNKNOWN or when no half record was ever written). :meth:`decide` writes it at once; the
        asyncio producer batches it with others."""
        if state is TxState.COMMIT and self.phase is not TxPhase.PREPARED and self.messages:
            raise TransactionStateError(
                f"transaction {self.tx_id} cannot commit: its half records are not all acknowledged"
            )
        self.advance(_FINAL_PHASE[state])
        if state is TxState.UNKNOWN or self.partition is None:
            return None
        return Decision(self.tx_id, state, len(self.messages) if state is TxState.COMMIT else None, reason)

    def outcome(
        self, state: TxState, error: BaseException | None, op_failures: Sequence[BaseException]
    ) -> TransactionResult:
        """The result once the op record was awaited (also kept as :attr:`result`); a failed op
        record is logged (the back-check decides)."""
        if op_failures:
            logger.warning(
                "transaction %s: the %s op record was not acknowledged (%s); the back-check will decide",
                self.tx_id,
                state,
                op_failures[0],
            )
        result = self.result = TransactionResult(
            tx_id=self.tx_id,
            state=state,
            error=error or (op_failures[0] if op_failures else None),
            partition=self.partition,
            op_acknowledged=state is not TxState.UNKNOWN and self.partition is not None and not op_failures,
        )
        if self.trace is not None:
            self.trace.end(
                state, result.error, messages=len(self.messages), op_acknowledged=result.op_acknowledged
            )
        return result


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
