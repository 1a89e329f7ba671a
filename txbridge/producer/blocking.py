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

from collections.abc import Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Unpack

from txbridge import tracing
from txbridge.delivery import Delivered, wait_all
from txbridge.producer.outcome import SETTLED_REASON, run_local, settle_unknown
from txbridge.producer.runtime import ProducerRuntime, ProducerSurface
from txbridge.producer.settings import ExecuteFunction, ProducerOptions
from txbridge.producer.transaction import ProducerTransaction, normalise_messages, order_key_bytes
from txbridge.transaction import Message, TransactionResult
from txbridge.wire import TxState


class TransactionProducer(ProducerSurface):
    """A transactional producer instance of a producer group.

    It runs on a :class:`~txbridge.producer.runtime.ProducerRuntime` of its own (check server,
    heartbeat, shared Kafka producer, topic listings, lifecycle) and adds the blocking
    transaction API. :class:`~txbridge.aio.AsyncTransactionProducer` takes the same arguments.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the producer group: every instance of it can answer back-checks of the others.
        **options: the settings, :class:`~txbridge.ProducerOptions` (where each is described);
            ``secret`` is required, and so is ``listener`` or ``check``.

    Raises:
        ConfigurationError: a setting is missing or invalid (checked here, without I/O).
        TypeError: a keyword that is not a :class:`~txbridge.ProducerOptions` name (a misspelt one).
    """

    def __init__(self, bootstrap: str, group: str, **options: Unpack[ProducerOptions]) -> None:
        super().__init__(bootstrap, group, options)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Connect, check the txbridge topics, serve back-checks, register this instance.

        Raises:
            KafkaUnavailableError: no broker answers at ``bootstrap``.
            ConfigurationError: the txbridge topics are missing or have another partition count,
                or the check server cannot listen where asked.
            TransactionStateError: the producer was already started or closed.
        """
        self._runtime.start()

    def close(self) -> None:
        """Deregister (tombstone), stop the check server, deliver what is queued. Idempotent."""
        self._runtime.close()

    def __enter__(self) -> TransactionProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- transactions

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
        runtime = self._runtime
        run = runtime.execute_of(execute)
        messages = normalise_messages(message)
        runtime.know_topics(messages)
        tx = Transaction(runtime)
        tx.enqueue(messages)
        tx.settle(wait_all(tx.take_pending(), runtime.ack_timeout_s))
        if tx.half_error is not None:
            state, error, reason = tx.half_failure()
            return tx._finish(state, error, reason=reason)
        with tracing.current(tx.trace):  # the application's spans in the local transaction are its children
            state, error = run_local(run, tx.local, arg)
        return tx._finish(state, error)

    def transaction(self, order_key: Any = None) -> Transaction:
        """A transaction as a context manager (several messages, one local transaction).

        Args:
            order_key: picks the half partition (default: the first message's key, else
                the tx id). Transactions with the same order key are republished in commit order.
        """
        return Transaction(self._runtime, order_key)


class Transaction(ProducerTransaction[Future[Delivered]]):
    """A transaction opened by :meth:`TransactionProducer.transaction`.

    ``send()`` waits for the half record's acknowledgement by default, so any local
    commit after it is safe. With ``send(msg, wait=False)`` records are only
    enqueued: call :meth:`prepare` before committing locally.

    Attributes:
        result: the :class:`TransactionResult`, set when the block exits.
    """

    __slots__ = ("_runtime",)

    def __init__(self, runtime: ProducerRuntime, order_key: Any = None) -> None:
        runtime.require_started()
        settings = runtime.settings
        super().__init__(settings, runtime.catalog, runtime.pump.write, order_key_bytes(settings, order_key))
        self._runtime = runtime

    def send(self, message: Message | Sequence[Message], *, wait: bool = True) -> None:
        """Write ``message`` as a half record; a sequence of messages as one record each, in order.

        Args:
            wait: return only once it is (they are) acknowledged (default). False: enqueue
                only; :meth:`prepare` must then run before the local commit.

        Raises:
            KafkaOperationError: the half record was not acknowledged (with ``wait``);
                leaving the block with it rolls the transaction back.
            UnknownTopicError: its topic, or its explicit partition, does not exist (not written).
            MessageTooLargeError: it is above ``max_message_bytes`` (not written).
            SerializationError: the key or value cannot be serialized (not written).
        """
        messages = normalise_messages(message)
        self._runtime.know_topics(messages)
        self.enqueue(messages)
        if wait:
            self.prepare()

    def prepare(self) -> None:
        """Wait until every half record sent so far is acknowledged.

        Raises:
            KafkaOperationError: one was not; the transaction can only roll back.
        """
        self.settle_or_raise(wait_all(self.take_pending(), self._runtime.ack_timeout_s))

    def __enter__(self) -> Transaction:
        self._traced = tracing.current(self.trace)
        self._traced.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Settle records still in flight first, so the op record follows every half record.
        self.settle(wait_all(self.take_pending(), self._runtime.ack_timeout_s))
        state, error, reason, to_raise = self.exit_decision(exc)
        self._finish(state, error, reason=reason)
        self._traced.__exit__(exc_type, exc, tb)
        if to_raise is not None:
            raise to_raise from None

    def _finish(self, state: TxState, error: BaseException | None, *, reason: str = "") -> TransactionResult:
        """Settle an UNKNOWN with a decisive check, write the op record, wait for it."""
        runtime = self._runtime
        if state is TxState.UNKNOWN and runtime.settles_unknown and self.partition is not None:
            settled = settle_unknown(runtime.check, self.local)
            if settled is not TxState.UNKNOWN:
                state, reason = settled, SETTLED_REASON
        future = self.decide(state, reason=reason)
        return self.outcome(
            state, error, wait_all([future], runtime.ack_timeout_s) if future is not None else []
        )
