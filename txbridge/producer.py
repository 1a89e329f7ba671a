"""The blocking transactional producer: half messages, the local transaction, the decision.

Two ways to run a transaction:

- :meth:`TransactionProducer.send_in_transaction` (RocketMQ's form): the half
  records are written and acknowledged, then ``execute(txn, arg)`` runs the local
  transaction and answers COMMIT, ROLLBACK or UNKNOWN (an exception is UNKNOWN).
- :meth:`TransactionProducer.transaction` (a context manager): ``tx.send()``
  returns once its half record is acknowledged (or, with ``wait=False``, after
  :meth:`Transaction.prepare`), so the local commit inside the block always comes
  after the half records are durable. A clean exit writes COMMIT, an exception
  writes ROLLBACK and propagates.

A message the coordinator could not republish once committed (its topic or
explicit partition does not exist, or it is above ``max_message_bytes``) raises
a :class:`~txbridge.errors.MessageRejectedError` before its half record is
written and before the local transaction runs.

One confluent producer serves every concurrent transaction of the instance;
delivery reports are routed to per-record futures by a background thread, so
records of concurrent transactions batch together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from enum import StrEnum
from types import TracebackType
from typing import Any

from starlette.applications import Starlette

from txbridge import _kafka
from txbridge._core import (
    SETTLED_REASON,
    H,
    OpenTransaction,
    ProducerSettings,
    TopicCatalog,
    TransactionBlock,
    TransactionFactory,
    checked_answer,
    half_failure,
    local_failure,
    normalise_messages,
    op_outcome,
    order_key_bytes,
    settle_unknown,
    settles_unknown,
)
from txbridge.checkback import CHECK_PATH, CheckServer, build_check_app
from txbridge.client_config import ClientConfig
from txbridge.delivery import Delivered, DeliveryPump, wait_all
from txbridge.errors import ConfigurationError, KafkaOperationError, TransactionStateError
from txbridge.limits import DEFAULT_MAX_MESSAGE_BYTES
from txbridge.registry import Heartbeat
from txbridge.serializers import BytesSerializer, Serializer
from txbridge.transaction import (
    LocalTransaction,
    Message,
    TransactionListener,
    TransactionResult,
    is_decisive,
)
from txbridge.wire import DEFAULT_NAMESPACE, TxState

logger = logging.getLogger(__name__)

ExecuteFunction = Callable[[LocalTransaction, Any], Any]
CheckFunction = Callable[[LocalTransaction], Any]


class _Lifecycle(StrEnum):
    NEW = "NEW"
    STARTED = "STARTED"
    CLOSED = "CLOSED"


class TransactionProducer:
    """A transactional producer instance of a producer group.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the producer group: every instance of it can answer back-checks of the others.
        secret: the group's HMAC secret for back-check signatures (never logged).
        listener: a :class:`TransactionListener` (execute + check), or:
        check: a check function ``check(txn) -> TxState`` (e.g. ``barrier.check``).
        namespace: the txbridge topic prefix (as given to ``txbridge init``).
        partitions: partitions of ``<ns>_half``/``<ns>_op``; default: their count, read at start.
            A value that disagrees with the topics is refused at start, and so is a count that
            changes under a running producer (its keys would move to other half partitions).
        instance_id: this instance's id (default ``host-pid-random``).
        check_host: interface of the built-in check server.
        check_port: its port; 0 picks a free one.
        serve_checks: False to mount :attr:`check_app` in your own ASGI server instead.
        advertised_url: the check URL put in the registry (default from host and port).
        value_serializer: turns message values into bytes (default: bytes as they are).
        key_serializer: turns message keys into bytes.
        heartbeat_interval_s: seconds between registry heartbeats (each says it, so a coordinator
            that hears none for 2.5 intervals asks another live instance about this one's
            transactions at once when the check is decisive, instead of after the check delay).
        max_message_bytes: must match the coordinator's ``max_message_bytes`` (default 1 MiB):
            a larger message (as :func:`txbridge.limits.record_size` counts it republished) is
            refused before its half record is written, instead of quarantined once committed.
        settle_unknown: when the local transaction ends UNKNOWN (or raises), ask the check
            function at once (then after 50 and 250 ms) and write its COMMIT or ROLLBACK
            instead of leaving the outcome to a back-check seconds later. Default (None): only
            when the check is marked :func:`~txbridge.decisive` (the barrier's ``check`` is):
            an ordinary check asked too early could answer ROLLBACK for a commit still on its
            way, which is what the coordinator's check delay guards against.
        client_config: the cluster's client settings (security), shared by every part: a
            :class:`~txbridge.client_config.ClientConfig` (e.g. ``ClientConfig.load("client.properties")``)
            or a dict of Java or librdkafka names.
        extra_config: librdkafka settings on top of txbridge's (idempotent, acks=all) and of
            ``client_config``.

    Raises:
        ConfigurationError: a setting is missing or invalid (checked here, without I/O).
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        secret: bytes | str,
        listener: TransactionListener | None = None,
        check: CheckFunction | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        partitions: int | None = None,
        instance_id: str | None = None,
        check_host: str = "127.0.0.1",
        check_port: int = 0,
        serve_checks: bool = True,
        advertised_url: str | None = None,
        value_serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        heartbeat_interval_s: float = 1.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        settle_unknown: bool | None = None,
        client_config: ClientConfig | Mapping[str, Any] | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.settings = ProducerSettings.build(
            bootstrap,
            group,
            secret,
            namespace=namespace,
            partitions=partitions,
            instance_id=instance_id or "",
            check_host=check_host,
            check_port=check_port,
            serve_checks=serve_checks,
            advertised_url=advertised_url,
            value_serializer=value_serializer or BytesSerializer(),
            key_serializer=key_serializer or BytesSerializer(),
            heartbeat_interval_s=heartbeat_interval_s,
            max_message_bytes=max_message_bytes,
            settle_unknown=settle_unknown,
            extra_config={**ClientConfig.coerce(client_config).librdkafka(), **(extra_config or {})},
        )
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
        #: The check function (the back-check's answer; also asked after an UNKNOWN, see
        #: ``settle_unknown``).
        self.check = check
        #: Whether this producer settles an UNKNOWN local transaction with :attr:`check` itself.
        self.settles_unknown = settles_unknown(self.settings, check)
        #: The ASGI app answering back-checks (``POST /txbridge/check``), to mount when
        #: ``serve_checks=False``.
        self.check_app: Starlette = build_check_app(self.settings.group, self.settings.secret, check)
        # Op records on a producer of their own that does not linger (see DeliveryPump).
        self._pump = DeliveryPump(
            self.settings.bootstrap, self.settings.extra_config, urgent_topics=(self.settings.topics.op,)
        )
        #: Partition counts of the real topics (internal seam with the asyncio producer).
        self.catalog = TopicCatalog()
        self._metadata_lock = threading.Lock()  # one listing at a time; the others use its answer
        self._transactions = TransactionFactory(self.settings, self._pump.write, self.catalog)
        self._server: CheckServer | None = None
        self._heartbeat: Heartbeat | None = None
        self._url: str | None = advertised_url
        self._state = _Lifecycle.NEW
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle

    @property
    def instance_id(self) -> str:
        return self.settings.instance_id

    @property
    def check_url(self) -> str:
        """The URL registered for back-checks (known after :meth:`start`)."""
        if self._url is None:
            raise TransactionStateError("the check URL is known once the producer is started")
        return self._url

    @property
    def ack_timeout_s(self) -> float:
        return self._pump.message_timeout_s + 5

    def start(self) -> None:
        """Connect, check the txbridge topics, serve back-checks, register this instance.

        Raises:
            KafkaUnavailableError: no broker answers at ``bootstrap``.
            ConfigurationError: the txbridge topics are missing or have another partition count,
                or the check server cannot listen where asked.
            TransactionStateError: the producer was already started or closed.
        """
        with self._lock:
            if self._state is not _Lifecycle.NEW:
                raise TransactionStateError(f"the producer is {self._state}: a producer starts once")
            settings = self.settings
            _kafka.check_reachable(
                settings.bootstrap, extra=_kafka.settings_for("admin", settings.extra_config)
            )
            try:
                self._pump.start()
                self._check_topics()
                if settings.serve_checks:
                    self._server = CheckServer(self.check_app, settings.check_host, settings.check_port)
                    port = self._server.start()
                    self._url = settings.advertised_url or _url(settings.check_host, port)
                self._heartbeat = Heartbeat(
                    self._pump,
                    settings.topics.producers,
                    group=settings.group,
                    instance=settings.instance_id,
                    url=self.check_url,
                    interval_s=settings.heartbeat_interval_s,
                    decisive=is_decisive(self.check) or settings.settle_unknown is True,
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
        counts = self._pump.list_topics(timeout=15)
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
        self._transactions.partitions = found

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
        self._pump.close()

    def __enter__(self) -> TransactionProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_started(self) -> None:
        if self._state is not _Lifecycle.STARTED:
            raise TransactionStateError(
                f"the producer is {self._state}: call start() (or use `with producer:`) before transactions"
            )

    # ---------------------------------------------------------------- transactions

    @property
    def pump(self) -> DeliveryPump:
        """The shared Kafka producer (internal seam with the asyncio producer)."""
        return self._pump

    def open_transaction(self, order_key: Any = None) -> OpenTransaction[Future[Delivered]]:
        """A new transaction whose records are futures."""
        return self.open_with(self._transactions, order_key)

    def open_with(self, transactions: TransactionFactory[H], order_key: Any = None) -> OpenTransaction[H]:
        """A new transaction of ``transactions`` (internal seam with the asyncio producer)."""
        self._require_started()
        return transactions.open(order_key_bytes(self.settings, order_key))

    def know_topics(self, messages: Sequence[Message]) -> None:
        """Make the catalog answer for the topics of ``messages``: list the cluster's topics unless
        a listing it can trust is there (internal seam with the asyncio producer).

        A full listing, never a request for one topic: on a broker with
        ``auto.create.topics.enable`` that request would create the topic as a side effect.

        Raises:
            KafkaOperationError: the metadata could not be read and a topic was not known before.
        """
        asked_at = time.monotonic()
        catalog = self.catalog
        if not catalog.stale(messages, asked_at):
            return
        with self._metadata_lock:
            if not catalog.stale(messages, asked_at):
                return  # another thread listed while this one waited
            self._require_started()
            listed_at = time.monotonic()
            try:
                counts = self._pump.list_topics(timeout=METADATA_TIMEOUT_S)
            except KafkaOperationError as exc:
                if not catalog.known(messages):
                    raise
                # The topics were there a moment ago: the half write will meet the broker's state.
                logger.warning("re-reading topic metadata failed, keeping the last listing: %s", exc)
                catalog.keep(time.monotonic())
                return
            catalog.update(counts, listed_at)
            self._check_partition_count(counts)

    def resolve_execute(self, execute: ExecuteFunction | None) -> ExecuteFunction:
        if execute is not None:
            return execute
        if self.listener is None:
            raise TypeError("send_in_transaction needs execute= when the producer has no listener")
        return self.listener.execute_local_transaction

    def send_in_transaction(
        self,
        message: Message | Sequence[Message],
        execute: ExecuteFunction | None = None,
        arg: Any = None,
    ) -> TransactionResult:
        """Write the half records, run the local transaction, write its decision.

        Args:
            message: one :class:`Message`, or several (to one or more topics).
            execute: ``execute(txn, arg) -> TxState`` runs the local transaction
                (default: the listener's ``execute_local_transaction``). An exception
                counts as UNKNOWN (the back-check decides) and is in ``result.error``.
            arg: passed to ``execute`` as is.

        Returns:
            The outcome. A half record that was not acknowledged means the local
            transaction did not run: ROLLBACK, with the error.

        Raises:
            UnknownTopicError: a message's topic, or its explicit partition, does not exist
                (nothing written, ``execute`` not run).
            MessageTooLargeError: a message is above ``max_message_bytes`` (nothing written,
                ``execute`` not run).
            SerializationError: a key or value cannot be serialized (nothing written).
            KafkaOperationError: topic metadata could not be read (nothing written).
            TransactionStateError: the producer is not started.
        """
        run = self.resolve_execute(execute)
        messages = normalise_messages(message)
        self.know_topics(messages)
        tx = self.open_transaction()
        tx.enqueue(messages)
        tx.settle(wait_all(tx.take_pending(), self.ack_timeout_s))
        if tx.half_error is not None:
            return self._rollback_after_half_failure(tx)
        state, error = run_local(run, tx.local_view(), arg)
        return self._finish(tx, state, error)

    def transaction(self, order_key: Any = None) -> Transaction:
        """A transaction as a context manager (several messages, one local transaction).

        Args:
            order_key: picks the half partition (default: the first message's key, else
                the tx id). Transactions with the same order key are republished in commit order.
        """
        return Transaction(self, self.open_transaction(order_key))

    def _rollback_after_half_failure(self, tx: OpenTransaction[Future[Delivered]]) -> TransactionResult:
        state, error, reason = half_failure(tx)
        return self._finish(tx, state, error, reason=reason)

    def _finish(
        self,
        tx: OpenTransaction[Future[Delivered]],
        state: TxState,
        error: BaseException | None,
        *,
        reason: str = "",
    ) -> TransactionResult:
        if state is TxState.UNKNOWN and self.settles_unknown and tx.partition is not None:
            settled = settle_unknown(self.check, tx.local_view())
            if settled is not TxState.UNKNOWN:
                state, reason = settled, SETTLED_REASON
        future = tx.decide(state, reason=reason)
        return op_outcome(tx, state, error, wait_all([future], self.ack_timeout_s) if future else [])


def run_local(
    execute: ExecuteFunction, txn: LocalTransaction, arg: Any
) -> tuple[TxState, BaseException | None]:
    """Run the user's local transaction: its answer as a TxState, an exception as UNKNOWN."""
    try:
        answer = execute(txn, arg)
    except Exception as exc:  # RocketMQ's rule: the local transaction's failure is UNKNOWN, not ROLLBACK
        return local_failure(txn, exc)
    return checked_answer(txn, answer), None


class Transaction(TransactionBlock[Future[Delivered]]):
    """A transaction opened by :meth:`TransactionProducer.transaction`.

    ``send()`` waits for the half record's acknowledgement by default, so any local
    commit after it is safe. With ``send(msg, wait=False)`` records are only
    enqueued: call :meth:`prepare` before committing locally.

    Attributes:
        result: the :class:`TransactionResult`, set when the block exits.
    """

    def __init__(self, producer: TransactionProducer, tx: OpenTransaction[Future[Delivered]]) -> None:
        super().__init__(tx)
        self._producer = producer

    def send(self, message: Message, *, wait: bool = True) -> None:
        """Write ``message`` as a half record.

        Args:
            wait: return only once it is acknowledged (default). False: enqueue only;
                :meth:`prepare` must then run before the local commit.

        Raises:
            KafkaOperationError: the half record was not acknowledged (with ``wait``);
                leaving the block with it rolls the transaction back.
            UnknownTopicError: its topic, or its explicit partition, does not exist (not written).
            MessageTooLargeError: it is above ``max_message_bytes`` (not written).
            SerializationError: the key or value cannot be serialized (not written).
        """
        messages = [message]
        self._producer.know_topics(messages)
        self._tx.enqueue(messages)
        if wait:
            self.prepare()

    def prepare(self) -> None:
        """Wait until every half record sent so far is acknowledged.

        Raises:
            KafkaOperationError: one was not; the transaction can only roll back.
        """
        self._settled(wait_all(self._tx.take_pending(), self._producer.ack_timeout_s))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Settle records still in flight first, so the op record follows every half record.
        self._tx.settle(wait_all(self._tx.take_pending(), self._producer.ack_timeout_s))
        state, error, reason, to_raise = self._exit_decision(exc)
        self.result = self._producer._finish(self._tx, state, error, reason=reason)
        if to_raise is not None:
            raise to_raise from None


#: Seconds a topic listing may take before a send fails (nothing written).
METADATA_TIMEOUT_S = 10.0


def _url(host: str, port: int) -> str:
    import socket

    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding: advertise a reachable name
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{CHECK_PATH}"
