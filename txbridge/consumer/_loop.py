"""What both consumers share: set-up (settings, listener), lifecycle, rebalances, the poll loop.

One thread owns the Kafka consumer: it polls, pauses and resumes partitions,
and commits. Listeners run elsewhere (a worker per partition, or a pool) and
report back; the subclasses decide what is paused and what may be committed,
and :class:`~txbridge.consumer.partitions.Partitions` keeps which partitions are
assigned and paused and what was last committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any, ClassVar, Generic, Self, TypedDict, TypeVar

from txbridge import kafka, tracing
from txbridge.client_config import ClientConfig
from txbridge.consumer.dlq import Forwarder
from txbridge.consumer.model import ConcurrentContext, ConsumedMessage, OrderlyContext
from txbridge.consumer.partitions import TP, Partitions
from txbridge.consumer.tags import Subscription, parse_subscription
from txbridge.errors import ConfigurationError, TxBridgeError
from txbridge.kafka import Consumer, Producer, TopicPartition
from txbridge.wire import DEFAULT_NAMESPACE, Topics

logger = logging.getLogger(__name__)

ListenerT = TypeVar("ListenerT", bound=Callable[..., Any])


def call_listener(
    listener: Callable[[ConsumedMessage, Any], Any],
    message: ConsumedMessage,
    context: OrderlyContext | ConcurrentContext,
    *,
    success: StrEnum,
    failure: StrEnum,
    then: str,
) -> bool:
    """Call ``listener(message, context)``; True when it returns ``success``.

    Raising, returning ``failure`` or returning anything else are failures; the
    first and the last are logged, with what happens ``then``. A listener's
    error never stops the consumer.
    """
    try:
        with tracing.processing(
            message.topic, message.partition, message.offset, message.headers, context.attempt
        ):
            status = listener(message, context)
    except Exception:
        logger.warning(
            "listener raised on %s/%d@%d (attempt %d); %s",
            message.topic,
            message.partition,
            message.offset,
            context.attempt,
            then,
            exc_info=True,
        )
        return False
    if status == success:
        return True
    if status != failure:
        logger.warning("listener returned %r, not a %s; %s", status, type(success).__name__, then)
    return False


class ConsumerOptions(TypedDict, total=False):
    """The keyword settings both consumers take (each has its own besides).

    Attributes:
        subscription: tag expression (``*``, ``TAGA || TAGB``); others are committed unseen.
            Default ``*``.
        namespace: txbridge's topic namespace (names the dead-letter topic and the concurrent
            consumer's retry topic).
        commit_interval_s: how often processed offsets are committed. Default 0.5.
        shutdown_timeout_s: how long close/revocation waits for running listeners. Default 30.
        client_config: the client settings of every client (security: ``--command-config``'s
            file as a :class:`~txbridge.client_config.ClientConfig`, or a dict of Java or
            librdkafka names).
        extra_config: librdkafka settings passed through on top (e.g. ``session.timeout.ms``).
    """

    subscription: str
    namespace: str
    commit_interval_s: float
    shutdown_timeout_s: float
    client_config: ClientConfig | Mapping[str, Any] | None
    extra_config: Mapping[str, Any] | None


class ConsumerLoop(Generic[ListenerT]):
    """Base of :class:`OrderlyConsumer` and :class:`ConcurrentConsumer`.

    Set-up: checks and keeps the group, topics, subscription, listener and the
    :class:`ConsumerOptions`; a subclass adds its own settings.

    Lifecycle: :meth:`start` runs the loop on a background thread, :meth:`run`
    runs it in the caller's thread until ``stop_event`` is set; :meth:`close`
    (or leaving the ``with`` block) stops it, lets running listeners finish and
    commits what was processed. Nothing touches the network before then.

    Raises:
        ConfigurationError: no group or topic, a bad subscription expression, a listener
            that is not callable.
    """

    #: What the listener is called with and returns (named when it is not callable).
    listener_signature: ClassVar[str] = "(message, context) -> status"

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str] | str,
        listener: ListenerT,
        *,
        subscription: str = "*",
        namespace: str = DEFAULT_NAMESPACE,
        commit_interval_s: float = 0.5,
        poll_batch: int = 500,
        shutdown_timeout_s: float = 30.0,
        client_config: ClientConfig | Mapping[str, Any] | None = None,
        extra_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not group:
            raise ConfigurationError("a consumer needs a group id: pass group=...")
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or not all(self.topics):
            raise ConfigurationError("a consumer needs at least one topic: pass topics=[...]")
        self.bootstrap = bootstrap
        self.group = group
        self.subscription: Subscription = parse_subscription(subscription)
        if not callable(listener):
            raise ConfigurationError(f"listener must be callable: {self.listener_signature}")
        self._listener: ListenerT = listener
        self.names = Topics(namespace)
        self.dead_letter_topic = self.names.dead_letter(group)
        self._commit_interval_s = commit_interval_s
        self._poll_batch = poll_batch
        self._shutdown_timeout_s = shutdown_timeout_s
        self._extra = {**ClientConfig.coerce(client_config).librdkafka(), **(extra_config or {})}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self.forwarder: Forwarder | None = None
        self._partitions = Partitions(group)
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect, subscribe and run the loop on a background thread."""
        if self._thread is not None:
            raise TxBridgeError("this consumer was already started")
        self._open()
        self._thread = threading.Thread(target=self._guarded_loop, name=f"txb-{self.group}", daemon=True)
        self._thread.start()

    def run(self, stop_event: threading.Event | None = None) -> None:
        """Run in this thread until ``stop_event`` (or :meth:`close`) stops it; then shut down cleanly."""
        if stop_event is not None:
            self._stop = stop_event
        self._open()
        self._loop()

    def close(self) -> None:
        """Stop polling, let running listeners finish, commit what was processed, disconnect.

        Raises:
            TxBridgeError: the background loop had failed (the original error is chained).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._shutdown_timeout_s + 30)
        if self._error is not None:
            raise TxBridgeError(f"consumer {self.group} failed: {self._error}") from self._error

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ the loop

    def _open(self) -> None:
        self._ensure_topics()
        self._producer = kafka.producer(self.bootstrap, kafka.settings_for("producer", self._extra))
        self.forwarder = Forwarder(self._producer, self._stop)
        self._consumer = kafka.consumer(
            self.bootstrap, self.group, kafka.settings_for("consumer", self._extra)
        )
        self._consumer.subscribe(
            self._subscribed_topics(),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _ensure_topics(self) -> None:
        kafka.ensure_topics(
            self.bootstrap,
            [kafka.TopicSpec(self.dead_letter_topic)],
            extra=kafka.settings_for("admin", self._extra),
        )

    def _client(self) -> Consumer:
        return kafka.opened(self._consumer, f"consumer {self.group}")

    def _guarded_loop(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            logger.exception("consumer %s stopped on an error", self.group)
            self._error = exc

    def _loop(self) -> None:
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                for msg in kafka.consume_available(self._client(), self._poll_batch, 0.1):
                    err = msg.error()
                    if err is not None:
                        _raise_if_fatal(err, f"consumer {self.group}")
                        continue
                    self._handle((msg.topic(), msg.partition()), msg)
                self._tick()
                self._partitions.apply_pauses(self._client(), self._want_paused)
                if time.monotonic() - last_commit >= self._commit_interval_s:
                    self._partitions.commit(self._client(), self._committable())
                    last_commit = time.monotonic()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        try:
            self._stop_processing(self._shutdown_timeout_s)
            self._partitions.commit(self._client(), self._committable())
        finally:
            self._client().close()
            kafka.opened(self._producer, "the dead-letter producer").flush(10)
            logger.info("consumer %s closed", self.group)

    # ------------------------------------------------------------------ rebalances

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        logger.info("consumer %s assigned %s", self.group, sorted(tps))
        self._partitions.book.assign(tps)
        self._partitions_assigned(tps)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        logger.info("consumer %s revoked %s", self.group, sorted(tps))
        self._partitions_revoked(tps, self._shutdown_timeout_s)
        self._partitions.commit(self._client(), {tp: o for tp, o in self._committable().items() if tp in tps})
        self._forget(tps)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        logger.warning(
            "consumer %s lost %s (no commit: another member owns them now)", self.group, sorted(tps)
        )
        self._partitions_revoked(tps, 0.0)
        self._forget(tps)

    def _forget(self, tps: set[TP]) -> None:
        self._partitions.book.forget(tps)

    # ------------------------------------------------------------------ for subclasses

    def _subscribed_topics(self) -> list[str]:
        return list(self.topics)

    def _partitions_assigned(self, tps: set[TP]) -> None:
        raise NotImplementedError

    def _partitions_revoked(self, tps: set[TP], timeout_s: float) -> None:
        """Stop processing ``tps`` (waiting up to ``timeout_s`` for running listeners)."""
        raise NotImplementedError

    def _handle(self, tp: TP, msg: Any) -> None:
        raise NotImplementedError

    def _tick(self) -> None:
        """Called once per poll round."""

    def _want_paused(self, tp: TP) -> bool:
        raise NotImplementedError

    def _committable(self) -> dict[TP, int]:
        raise NotImplementedError

    def _stop_processing(self, timeout_s: float) -> None:
        raise NotImplementedError


def _raise_if_fatal(err: Any, what: str) -> None:
    """Raise a fatal consumer error; log any other and carry on polling."""
    error = kafka.to_error(err, what)
    if error.fatal:
        raise error
    logger.warning("%s", error)
