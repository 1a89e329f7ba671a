"""What the blocking and the asyncio producers share: settings, and one open transaction.

:class:`OpenTransaction` writes records and drives the lifecycle; it never waits.
The producers wait on the futures it returns (blocking, or through asyncio), so
the protocol steps live in one place.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from txbridge import wire
from txbridge.delivery import Delivered, DeliveryPump
from txbridge.errors import ConfigurationError, TransactionStateError
from txbridge.serializers import BytesSerializer, Serializer
from txbridge.transaction import (
    LocalTransaction,
    Message,
    TransactionLifecycle,
    TransactionResult,
    TxPhase,
    build_half_messages,
    phase_of,
    serialize_key,
)
from txbridge.wire import OpRecord, OpSource, Topics, TxState


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
    partitions: int = wire.DEFAULT_PARTITIONS
    instance_id: str = ""
    check_host: str = "127.0.0.1"
    check_port: int = 0
    serve_checks: bool = True
    advertised_url: str | None = None
    value_serializer: Serializer = field(default_factory=BytesSerializer)
    key_serializer: Serializer = field(default_factory=BytesSerializer)
    heartbeat_interval_s: float = 3.0
    extra_config: dict[str, Any] = field(default_factory=dict)

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
        partitions = options.get("partitions", wire.DEFAULT_PARTITIONS)
        if not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(f"partitions must be a positive integer, got {partitions!r}")
        if options.get("heartbeat_interval_s", 3.0) <= 0:
            raise ConfigurationError("heartbeat_interval_s must be positive")
        if not options.get("serve_checks", True) and not options.get("advertised_url"):
            raise ConfigurationError(
                "serve_checks=False needs advertised_url=: the URL where you mounted producer.check_app "
                "(path /txbridge/check), so the coordinator can reach it"
            )
        if not options.get("instance_id"):
            options["instance_id"] = default_instance_id()
        if "/" in options["instance_id"]:
            raise ConfigurationError("instance_id must not contain '/'")
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


class OpenTransaction:
    """One transaction in flight: its id, partition, messages, phase and unacknowledged records."""

    def __init__(
        self, settings: ProducerSettings, pump: DeliveryPump, order_key: bytes | None = None
    ) -> None:
        self.settings = settings
        self._pump = pump
        self.tx_id = wire.new_tx_id()
        self.lifecycle = TransactionLifecycle(self.tx_id)
        self.partition: int | None = None
        self.messages: list[Message] = []
        self.half_error: BaseException | None = None
        self._order_key = order_key
        self._pending: list[Future[Delivered]] = []

    @property
    def phase(self) -> TxPhase:
        return self.lifecycle.phase

    def local_view(self) -> LocalTransaction:
        return LocalTransaction(tx_id=self.tx_id, group=self.settings.group, messages=tuple(self.messages))

    def enqueue(self, messages: Sequence[Message]) -> None:
        """Write ``messages`` as half records (not awaited: see :meth:`take_pending`).

        Raises:
            SerializationError: a key or value cannot be serialized; nothing was written.
            TransactionStateError: the transaction was already decided, or a half write failed.
        """
        if not messages:
            raise ValueError("a transaction needs at least one message")
        if self.half_error is not None:
            raise TransactionStateError(f"transaction {self.tx_id} already failed to write a half record")
        if not self.lifecycle.can(TxPhase.SENDING):
            raise TransactionStateError(f"transaction {self.tx_id} is {self.phase}: no more messages")
        settings = self.settings
        halves = build_half_messages(
            self.tx_id,
            messages,
            first_seq=len(self.messages),
            group=settings.group,
            instance=settings.instance_id,
            key_serializer=settings.key_serializer,
            value_serializer=settings.value_serializer,
        )
        if self.partition is None:
            order_key = self._order_key or halves[0].key or self.tx_id.encode()
            self.partition = wire.half_partition(order_key, settings.partitions)
        self.lifecycle.advance(TxPhase.SENDING)
        self.messages.extend(messages)
        for half in halves:
            self._pending.append(
                self._pump.produce(
                    settings.topics.half,
                    partition=self.partition,
                    key=half.record_key(),
                    value=half.value,
                    headers=half.to_headers(),
                )
            )

    def take_pending(self) -> list[Future[Delivered]]:
        """The half records not yet awaited (the caller waits, then calls :meth:`settle`)."""
        pending, self._pending = self._pending, []
        return pending

    def settle(self, failures: Sequence[BaseException]) -> None:
        """Record the outcome of the awaited half records: PREPARED, or remember the failure."""
        if failures:
            self.half_error = self.half_error or failures[0]
        elif self.phase is TxPhase.SENDING and not self._pending:
            self.lifecycle.advance(TxPhase.PREPARED)

    def decide(self, state: TxState, *, reason: str = "") -> Future[Delivered] | None:
        """Move to the final phase and write the op record (COMMIT/ROLLBACK; nothing for UNKNOWN
        or when no half record was ever written)."""
        if state is TxState.COMMIT and self.phase is not TxPhase.PREPARED and self.messages:
            raise TransactionStateError(
                f"transaction {self.tx_id} cannot commit: its half records are not all acknowledged"
            )
        self.lifecycle.advance(phase_of(state))
        if state is TxState.UNKNOWN or self.partition is None:
            return None
        key, value = OpRecord(
            tx_id=self.tx_id,
            state=state,
            source=OpSource.PRODUCER,
            count=len(self.messages) if state is TxState.COMMIT else None,
            group=self.settings.group,
            instance=self.settings.instance_id,
            reason=reason,
        ).encode()
        return self._pump.produce(self.settings.topics.op, partition=self.partition, key=key, value=value)

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
        raise TypeError("send_in_transaction takes a Message or a non-empty sequence of Message")
    return messages
