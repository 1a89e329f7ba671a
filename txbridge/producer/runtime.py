"""One producer instance's parts and lifecycle, under either producer: :class:`ProducerRuntime`.

The runtime owns everything that is neither blocking nor awaited: the settings
(checked here), the check function and the check server, the registry
heartbeat, the shared Kafka producer (:class:`~txbridge.delivery.DeliveryPump`),
the topic catalog and its listings, and the lifecycle (NEW, STARTED, CLOSED).
:class:`~txbridge.producer.TransactionProducer` adds the blocking transaction API,
:class:`~txbridge.aio.AsyncTransactionProducer` the awaitable one; neither calls the other.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any

from starlette.applications import Starlette

from txbridge import kafka
from txbridge.checkback import CHECK_PATH, CheckServer, build_check_app
from txbridge.client_config import ClientConfig
from txbridge.delivery import DeliveryPump
from txbridge.errors import ConfigurationError, KafkaOperationError, TransactionStateError
from txbridge.producer.catalog import TopicCatalog
from txbridge.producer.outcome import settles_unknown
from txbridge.producer.settings import (
    CheckFunction,
    ExecuteFunction,
    ProducerOptions,
    ProducerSettings,
    check_option_names,
)
from txbridge.registry import Heartbeat
from txbridge.transaction import Message, TransactionListener, check_source, is_decisive

logger = logging.getLogger(__name__)

#: Seconds a topic listing may take before a send fails (nothing written).
METADATA_TIMEOUT_S = 10.0


class _Lifecycle(StrEnum):
    NEW = "NEW"
    STARTED = "STARTED"
    CLOSED = "CLOSED"


class ProducerRuntime:
    """One producer instance's parts and lifecycle, for either producer.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the producer group.
        options: the :class:`ProducerOptions`.
        owner: the producer's class name, for error messages.

    Raises:
        TypeError: an option that is not a :class:`ProducerOptions` name.
        ConfigurationError: a setting is missing or invalid (checked here, without I/O).
    """

    def __init__(self, bootstrap: str, group: str, options: ProducerOptions, *, owner: str) -> None:
        check_option_names(owner, options)
        rest: dict[str, Any] = dict(options)
        secret = rest.pop("secret", None)
        listener: TransactionListener | None = rest.pop("listener", None)
        check: CheckFunction | None = rest.pop("check", None)
        client_config = ClientConfig.coerce(rest.pop("client_config", None))
        rest["extra_config"] = {**client_config.librdkafka(), **(rest.get("extra_config") or {})}
        self.settings = ProducerSettings.build(bootstrap, group, secret, **rest)
        if listener is not None and check is not None:
            raise ConfigurationError("pass either listener= or check=, not both")
        if listener is not None:
            check = listener.check_local_transaction
        if check is None:
            raise ConfigurationError(
                "a back-check answer is required: pass listener= (a TransactionListener) "
                "or check= (e.g. barrier.check)"
            )
        self.listener = listener
        self.check: CheckFunction = check
        self.settles_unknown = settles_unknown(self.settings, check)
        self.check_app: Starlette = build_check_app(self.settings.group, self.settings.secret, check)
        # Op records on a producer of their own that does not linger (see DeliveryPump).
        self.pump = DeliveryPump(
            self.settings.bootstrap, self.settings.extra_config, urgent_topics=(self.settings.topics.op,)
        )
        #: Partition counts of the real topics, read by every transaction.
        self.catalog = TopicCatalog()
        self._metadata_lock = threading.Lock()  # one listing at a time; the others use its answer
        self._server: CheckServer | None = None
        self._heartbeat: Heartbeat | None = None
        self._url: str | None = self.settings.advertised_url
        self._state = _Lifecycle.NEW
        self._lock = threading.Lock()

    @property
    def check_url(self) -> str:
        if self._url is None:
            raise TransactionStateError("the check URL is known once the producer is started")
        return self._url

    @property
    def ack_timeout_s(self) -> float:
        """How long a record's acknowledgement is awaited before it counts as failed."""
        return self.pump.message_timeout_s + 5

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Both producers' ``start()`` (blocking; the errors are in
        :meth:`txbridge.TransactionProducer.start`)."""
        with self._lock:
            if self._state is not _Lifecycle.NEW:
                raise TransactionStateError(f"the producer is {self._state}: a producer starts once")
            settings = self.settings
            kafka.check_reachable(
                settings.bootstrap, extra=kafka.settings_for("admin", settings.extra_config)
            )
            try:
                self.pump.start()
                self._check_topics()
                # The barrier's identity is read from its database here, once.
                self.settings = settings = replace(
                    self.settings, check_source=check_source(self.check, settings.check_source)
                )
                if settings.serve_checks:
                    self._server = CheckServer(self.check_app, settings.check_host, settings.check_port)
                    port = self._server.start()
                    self._url = settings.advertised_url or _url(settings.check_host, port)
                self._heartbeat = Heartbeat(
                    self.pump,
                    settings.topics.producers,
                    group=settings.group,
                    instance=settings.instance_id,
                    url=self.check_url,
                    interval_s=settings.heartbeat_interval_s,
                    decisive=is_decisive(self.check) or settings.settle_unknown is True,
                    source=settings.check_source,
                )
                self._heartbeat.start()
            except BaseException:
                self._shutdown()
                self._state = _Lifecycle.CLOSED
                raise
            self._state = _Lifecycle.STARTED
            logger.info(
                "producer %s of group %s started; back-checks at %s",
                settings.instance_id,
                settings.group,
                self._url,
            )

    def _check_topics(self) -> None:
        settings = self.settings
        topics = settings.topics
        listed_at = time.monotonic()
        counts = self.pump.list_topics(timeout=15)
        self.catalog.update(counts, listed_at)
        missing = [t for t in (topics.half, topics.op, topics.producers) if counts.get(t) is None]
        if missing:
            raise ConfigurationError(
                f"txbridge topics {', '.join(missing)} do not exist at {settings.bootstrap}: run "
                f"`txbridge init --namespace {settings.namespace}`"
            )
        if counts[topics.half] != counts[topics.op]:
            raise ConfigurationError(
                f"{topics.half} has {counts[topics.half]} partitions but {topics.op} has "
                f"{counts[topics.op]}: they must be co-partitioned; recreate them with `txbridge init`"
            )
        found = counts[topics.half]
        if settings.partitions is not None and settings.partitions != found:
            raise ConfigurationError(
                f"{topics.half} has {found} partitions but this producer has partitions="
                f"{settings.partitions}: pass partitions={found}, or leave partitions out (the producer "
                f"then takes the topic's count)"
            )
        # The half partition of a key depends on the count: it is fixed for this producer's life.
        self.settings = replace(settings, partitions=found)

    def _check_partition_count(self, counts: Mapping[str, int | None]) -> None:
        """Refuse to go on when ``<ns>_half`` changed its partition count under this producer."""
        half = self.settings.topics.half
        now = counts.get(half)
        if now is not None and now != self.settings.partitions:
            raise ConfigurationError(
                f"{half} now has {now} partitions, not the {self.settings.partitions} this producer "
                f"started with: keys would move to other half partitions and lose their order. "
                f"Restart every producer and coordinator of namespace {self.settings.namespace!r}"
            )

    def close(self) -> None:
        """Deregister (tombstone), stop the check server, deliver what is queued. Idempotent."""
        with self._lock:
            if self._state is _Lifecycle.CLOSED:
                return
            self._state = _Lifecycle.CLOSED
            self._shutdown()

    def _shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.pump.close()

    def require_started(self) -> None:
        if self._state is not _Lifecycle.STARTED:
            raise TransactionStateError(
                f"the producer is {self._state}: call start() (or use `with producer:`) before transactions"
            )

    # ---------------------------------------------------------------- transactions

    def execute_of(self, execute: ExecuteFunction | None) -> ExecuteFunction:
        """``execute``, else the listener's ``execute_local_transaction``."""
        if execute is not None:
            return execute
        if self.listener is None:
            raise TypeError("send_in_transaction needs execute= when the producer has no listener")
        return self.listener.execute_local_transaction

    def needs_listing(self, messages: Sequence[Message]) -> bool:
        """True when :meth:`know_topics` would list the cluster's topics for ``messages`` now."""
        return self.catalog.stale(messages, time.monotonic())

    def know_topics(self, messages: Sequence[Message]) -> None:
        """Make the catalog answer for the topics of ``messages``: list the cluster's topics unless
        a listing it can trust is there (blocking).

        A full listing, never a request for one topic: on a broker with
        ``auto.create.topics.enable`` that request would create the topic as a side effect.

        Raises:
            KafkaOperationError: the metadata could not be read and a topic was not known before.
            ConfigurationError: ``<ns>_half`` changed its partition count under this producer.
        """
        asked_at = time.monotonic()
        catalog = self.catalog
        if not catalog.stale(messages, asked_at):
            return
        with self._metadata_lock:
            if not catalog.stale(messages, asked_at):
                return  # another thread listed while this one waited
            self.require_started()
            listed_at = time.monotonic()
            try:
                counts = self.pump.list_topics(timeout=METADATA_TIMEOUT_S)
            except KafkaOperationError as exc:
                if not catalog.known(messages):
                    raise
                # The topics were there a moment ago: the half write will meet the broker's state.
                logger.warning("re-reading topic metadata failed, keeping the last listing: %s", exc)
                catalog.keep(time.monotonic())
                return
            catalog.update(counts, listed_at)
            self._check_partition_count(counts)


class ProducerSurface:
    """What both producers show of their runtime: settings, check app and URL, instance id, check.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the producer group: every instance of it can answer back-checks of the others.
        options: the :class:`ProducerOptions`.
    """

    def __init__(self, bootstrap: str, group: str, options: ProducerOptions) -> None:
        self._runtime = ProducerRuntime(bootstrap, group, options, owner=type(self).__name__)

    @property
    def settings(self) -> ProducerSettings:
        """The validated settings (``partitions`` is the half topic's count once started)."""
        return self._runtime.settings

    @property
    def instance_id(self) -> str:
        return self._runtime.settings.instance_id

    @property
    def check_url(self) -> str:
        """The URL registered for back-checks (known after ``start()``)."""
        return self._runtime.check_url

    @property
    def check_app(self) -> Starlette:
        """The ASGI app answering back-checks (``POST /txbridge/check``), to mount when
        ``serve_checks=False``."""
        return self._runtime.check_app

    @property
    def listener(self) -> TransactionListener | None:
        return self._runtime.listener

    @property
    def check(self) -> CheckFunction:
        """The check function (the back-check's answer; also asked after an UNKNOWN, see
        ``settle_unknown``)."""
        return self._runtime.check

    @property
    def settles_unknown(self) -> bool:
        """Whether this producer settles an UNKNOWN local transaction with :attr:`check` itself."""
        return self._runtime.settles_unknown


def runtime_of(producer: ProducerSurface) -> ProducerRuntime:
    """The runtime under ``producer`` (for the tests and tools that need its catalog or pump)."""
    return producer._runtime


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding: advertise a reachable name
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{CHECK_PATH}"
