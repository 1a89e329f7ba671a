"""A transaction's data and lifecycle: messages, the local-transaction view, results, phases.

Pure logic, no I/O: the producers (blocking and asyncio) drive a
:class:`TransactionLifecycle` through its phases and encode half and op records
with a :class:`RecordEncoder`.

Phases and allowed transitions (one table, one guarded setter)::

    NEW ──send──> SENDING ──halves acked──> PREPARED ──> COMMITTED | ROLLED_BACK | UNKNOWN
     │               │                         │
     │               └──────> ROLLED_BACK      └──send──> SENDING (another message, context form)
     ├──────────────────────> ROLLED_BACK  (exception before any message)
     └──────────────────────> COMMITTED    (empty transaction: nothing is written)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

from txbridge import wire
from txbridge.errors import SerializationError, TransactionStateError
from txbridge.serializers import Serializer
from txbridge.tracing import has_traceparent
from txbridge.wire import TxState

HeadersArg = Sequence[tuple[str, bytes]] | Mapping[str, bytes]


@dataclass(frozen=True)
class Message:
    """A message to publish when its transaction commits.

    Args:
        topic: the real topic it is published to on COMMIT.
        value: the value, turned into bytes by the producer's ``value_serializer``.
        key: the key, turned into bytes by ``key_serializer``; the first message's key
            picks the transaction's half partition (so same-key messages keep commit order).
        headers: user headers, passed through unchanged (pairs or a mapping, bytes values).
        partition: an explicit partition of the real topic.
        check_after: seconds before the first back-check of this transaction.
    """

    topic: str
    value: Any
    key: Any = None
    headers: HeadersArg = ()
    partition: int | None = None
    check_after: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError("Message.topic must be a non-empty topic name")
        pairs = tuple(self.headers.items()) if isinstance(self.headers, Mapping) else tuple(self.headers)
        for name, raw in pairs:
            if not isinstance(name, str) or not isinstance(raw, bytes):
                raise TypeError(f"Message header {name!r} must be a (str, bytes) pair")
            if name in wire.PROTOCOL_HEADERS or name == wire.H_TX:
                raise ValueError(f"Message header {name!r} is a txbridge protocol header; pick another name")
        object.__setattr__(self, "headers", pairs)
        if self.partition is not None and self.partition < 0:
            raise ValueError("Message.partition must be >= 0")
        if self.check_after is not None and self.check_after < 0:
            raise ValueError("Message.check_after must be >= 0 seconds")

    @property
    def header_pairs(self) -> tuple[tuple[str, bytes], ...]:
        """The user headers as ``(name, value)`` pairs (how they are stored after construction)."""
        return cast(tuple[tuple[str, bytes], ...], self.headers)


@dataclass(frozen=True)
class LocalTransaction:
    """What the local-transaction and check callbacks see of a transaction.

    In a back-check, messages are rebuilt from the check request: topic, key
    (serialized bytes) and headers; their value is ``None``.
    """

    tx_id: str
    group: str
    messages: tuple[Message, ...] = ()
    attempt: int = 0  # 0 while executing; the back-check attempt (1, 2, ...) in a check


@dataclass(frozen=True)
class TransactionResult:
    """The outcome of a transaction as the producer knows it.

    Attributes:
        tx_id: the transaction id.
        state: COMMIT, ROLLBACK or UNKNOWN (UNKNOWN: the back-check decides).
        error: what went wrong, if anything (a failed half write, the callback's exception,
            an op record that was not acknowledged).
        partition: the half/op partition of the transaction (``None`` if nothing was written).
        op_acknowledged: True when the COMMIT/ROLLBACK op record was acknowledged by Kafka.
    """

    tx_id: str
    state: TxState
    error: BaseException | None = None
    partition: int | None = None
    op_acknowledged: bool = False


@runtime_checkable
class TransactionListener(Protocol):
    """RocketMQ's TransactionListener: run the local transaction, answer back-checks."""

    def execute_local_transaction(self, txn: LocalTransaction, arg: Any) -> TxState: ...

    def check_local_transaction(self, txn: LocalTransaction) -> TxState: ...


class TxPhase(StrEnum):
    NEW = "NEW"
    SENDING = "SENDING"
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    UNKNOWN = "UNKNOWN"


_TRANSITIONS: dict[TxPhase, frozenset[TxPhase]] = {
    TxPhase.NEW: frozenset({TxPhase.SENDING, TxPhase.ROLLED_BACK, TxPhase.COMMITTED}),
    TxPhase.SENDING: frozenset({TxPhase.PREPARED, TxPhase.ROLLED_BACK}),
    TxPhase.PREPARED: frozenset({TxPhase.SENDING, TxPhase.COMMITTED, TxPhase.ROLLED_BACK, TxPhase.UNKNOWN}),
    TxPhase.COMMITTED: frozenset(),
    TxPhase.ROLLED_BACK: frozenset(),
    TxPhase.UNKNOWN: frozenset(),
}

_FINAL_PHASE = {
    TxState.COMMIT: TxPhase.COMMITTED,
    TxState.ROLLBACK: TxPhase.ROLLED_BACK,
    TxState.UNKNOWN: TxPhase.UNKNOWN,
}


def phase_of(state: TxState) -> TxPhase:
    """The final phase an outcome leads to."""
    return _FINAL_PHASE[state]


@dataclass
class TransactionLifecycle:
    """The phase of one transaction, changed only through :meth:`advance`."""

    tx_id: str
    phase: TxPhase = TxPhase.NEW
    history: list[TxPhase] = field(default_factory=list)

    def can(self, target: TxPhase) -> bool:
        return target in _TRANSITIONS[self.phase]

    def advance(self, target: TxPhase) -> None:
        """Move to ``target``.

        Raises:
            TransactionStateError: the table forbids it (e.g. send after the decision).
        """
        if target not in _TRANSITIONS[self.phase]:
            raise TransactionStateError(f"transaction {self.tx_id} cannot go from {self.phase} to {target}")
        self.history.append(self.phase)
        self.phase = target

    @property
    def finished(self) -> bool:
        return not _TRANSITIONS[self.phase]


def coerce_state(value: Any) -> TxState:
    """A callback's answer as a TxState; anything unrecognised is UNKNOWN (never COMMIT)."""
    if isinstance(value, TxState):
        return value
    if isinstance(value, str):
        try:
            return TxState(value.upper())
        except ValueError:
            return TxState.UNKNOWN
    return TxState.UNKNOWN


def serialize_key(serializer: Serializer, key: Any) -> bytes | None:
    try:
        return serializer.serialize(key)
    except SerializationError:
        raise
    except Exception as exc:  # a user serializer may raise anything; report it in txbridge's tree
        raise SerializationError(f"key serializer {serializer!r} failed: {exc}") from exc


class HalfRecord(NamedTuple):
    """A half record ready to produce: its Kafka key and value, its headers, the serialized message key."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]
    message_key: bytes | None


class RecordEncoder:
    """Encodes one producer instance's half and op records (wire format v1).

    The same bytes as :meth:`wire.HalfMessage.to_headers` and :meth:`wire.OpRecord.encode`
    (a unit test pins it), with what every record of the instance shares (version,
    group and instance headers, the op record's JSON fields) encoded once: this is
    the producer's per-transaction hot path.

    Args:
        group: the producer group.
        instance: this instance's id.
        key_serializer: turns message keys into bytes.
        value_serializer: turns message values into bytes.
        source: the source of truth this instance's check answers from (:func:`check_source`).
    """

    def __init__(
        self,
        group: str,
        instance: str,
        key_serializer: Serializer,
        value_serializer: Serializer,
        source: str | None = None,
    ) -> None:
        self.key_serializer = key_serializer
        self._source = None if source is None else (wire.H_SOURCE, source.encode())
        self.value_serializer = value_serializer
        self._version = (wire.H_VERSION, str(wire.VERSION).encode())
        self._group = (wire.H_GROUP, group.encode())
        self._instance = (wire.H_INSTANCE, instance.encode())
        who = f'"group":{json.dumps(group)},"instance":{json.dumps(instance)}'
        self._op_head = f'{{"v":{wire.VERSION},"tx":"'
        self._op_after_tx = {
            state: f'","state":"{state.value}","source":"{wire.OpSource.PRODUCER.value}",{who},"ts":'
            for state in (TxState.COMMIT, TxState.ROLLBACK)
        }

    def halves(
        self,
        tx_id: str,
        messages: Sequence[Message],
        first_seq: int,
        trace_headers: Sequence[tuple[str, bytes]] = (),
    ) -> list[HalfRecord]:
        """The half records of ``messages``, numbered from ``first_seq``.

        ``trace_headers`` (``traceparent``, ``tracestate``: the transaction's span) go into every
        record whose message does not carry a ``traceparent`` of its own.

        Raises:
            SerializationError: a key or value cannot be serialized (nothing is written then).
        """
        tx = tx_id.encode()
        ts = (wire.H_TS, str(time.time_ns() // 1_000_000).encode())
        records = []
        for seq, msg in enumerate(messages, first_seq):
            try:
                value = self.value_serializer.serialize(msg.value)
            except SerializationError:
                raise
            except Exception as exc:  # see serialize_key
                raise SerializationError(f"value serializer {self.value_serializer!r} failed: {exc}") from exc
            key = serialize_key(self.key_serializer, msg.key)
            headers = [
                self._version,
                (wire.H_TX, tx),
                (wire.H_SEQ, str(seq).encode()),
                (wire.H_TOPIC, msg.topic.encode()),
                self._group,
                self._instance,
                ts,
            ]
            if msg.partition is not None:
                headers.append((wire.H_PARTITION, str(msg.partition).encode()))
            if key is not None:
                headers.append((wire.H_KEY, key))
            if msg.check_after is not None:
                headers.append((wire.H_CHECK_AFTER, repr(float(msg.check_after)).encode()))
            if value is None:
                headers.append((wire.H_NULL, b"1"))
            if self._source is not None:
                headers.append(self._source)
            if msg.headers:
                headers.extend(msg.header_pairs)
            if trace_headers and not has_traceparent(msg.header_pairs):
                headers.extend(trace_headers)
            records.append(HalfRecord(tx, value, headers, key))
        return records

    def op(self, tx_id: str, state: TxState, *, count: int | None, reason: str = "") -> tuple[bytes, bytes]:
        """``(key, value)`` of the producer's COMMIT or ROLLBACK op record.

        ``tx_id`` is one of this producer's UUIDs, so it needs no JSON escaping.
        """
        body = self._op_head + tx_id + self._op_after_tx[state] + str(time.time_ns() // 1_000_000)
        if count is not None:
            body += f',"count":{count}'
        if reason:
            body += f',"reason":{json.dumps(reason)}'
        return tx_id.encode(), (body + "}").encode()


def local_transaction_from_check(request: wire.CheckRequest) -> LocalTransaction:
    """The :class:`LocalTransaction` a check callback receives: messages without values."""
    messages = tuple(
        Message(topic=m.topic, value=None, key=m.key, headers=_user_headers(m.headers))
        for m in request.messages
    )
    return LocalTransaction(
        tx_id=request.tx_id, group=request.group, messages=messages, attempt=request.attempt
    )


def _user_headers(headers: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    # A check request may carry protocol headers too; the callback sees the user's only.
    return tuple((n, v) for n, v in headers if n not in wire.PROTOCOL_HEADERS and n != wire.H_TX)


def decisive(check: Any) -> Any:
    """Mark a check function as decisive: it answers COMMIT or ROLLBACK, never UNKNOWN, and a
    local transaction can no longer commit after it answered ROLLBACK (the database barrier's
    ``check`` is one). The producer may then ask it itself as soon as its own local
    transaction ends UNKNOWN, instead of leaving the outcome to a back-check seconds later.

    Use it as a decorator, or ``decisive(my_check)``; returns ``check``.
    """
    try:
        check.txbridge_decisive = True
    except AttributeError:  # a bound method: mark the function behind it
        check.__func__.txbridge_decisive = True
    return check


def is_decisive(check: Any) -> bool:
    """True when ``check`` was marked with :func:`decisive`."""
    return bool(getattr(check, "txbridge_decisive", False))


def check_source(check: Any, declared: str | None = None) -> str:
    """The source of truth ``check`` answers from, said in every half record and heartbeat so
    that a coordinator asks another instance about a transaction only where its answer is true
    (:func:`txbridge.wire.can_answer`).

    ``declared`` (the producer's ``check_source``) wins. Otherwise a barrier's ``check`` says
    its database's identity (every instance on one database answers for the others), and any
    other check answers for its own instance only (:data:`~txbridge.wire.SOURCE_INSTANCE`).
    Reading a barrier's identity is I/O: call it when the producer starts.
    """
    if declared is not None:
        return declared
    identity = getattr(getattr(check, "__self__", None), "source_identity", None)
    if callable(identity):
        return str(identity())
    return wire.SOURCE_INSTANCE
