"""What a transaction is to the application: its messages, the local-transaction view, results,
the listener and the check function's marks.

Pure data and rules, no I/O. The producer's state of one transaction in flight
(phases, records) is :class:`txbridge.producer.transaction.ProducerTransaction`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from txbridge import wire
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
