"""The asyncio transactional producer: the same protocol, awaited instead of blocked on.

It runs on a runtime of its own, like :class:`~txbridge.producer.TransactionProducer`
(same constructor, :class:`~txbridge.ProducerOptions`): records go through the
runtime's shared Kafka producer and their delivery reports reach the event loop
in batches (:class:`_AckBridge`), so the loop never blocks on Kafka.
Start-up and shutdown (metadata, check server, registry) run in a worker thread.

``execute`` and check callbacks may be plain or ``async`` functions. A plain
``execute`` runs on the event loop thread: keep it short, or make it async.

Messages are checked as by the blocking producer (topic, partition, size) before
their half records are written; a topic listing, when one is due, runs in a
worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from functools import partial
from types import TracebackType
from typing import Any, Unpack

from txbridge import tracing
from txbridge.delivery import DeliveryPump, delivery_error
from txbridge.errors import KafkaOperationError
from txbridge.producer.outcome import SETTLED_REASON, run_local_async, settle_unknown_async
from txbridge.producer.records import Decision
from txbridge.producer.runtime import ProducerRuntime, ProducerSurface
from txbridge.producer.settings import ExecuteFunction, ProducerOptions, ProducerSettings
from txbridge.producer.transaction import ProducerTransaction, normalise_messages, order_key_bytes
from txbridge.transaction import Message, TransactionResult
from txbridge.wire import Headers, TxState

logger = logging.getLogger(__name__)


class _Ack:
    """One record's delivery report as the event loop sees it (changed on the loop thread only)."""

    __slots__ = ("done", "error", "wait")

    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None
        self.wait: _Wait | None = None


class _Wait:
    """A coroutine waiting for some records: one future, however many records."""

    __slots__ = ("acks", "deadline", "future", "outstanding")

    def __init__(self, future: asyncio.Future[None], acks: list[_Ack], deadline: float) -> None:
        self.future = future
        self.acks = acks
        self.outstanding = len(acks)
        self.deadline = deadline


class _AckBridge:
    """Writes records and hands their delivery reports to one event loop.

    Reports (from the delivery thread) are queued and the loop is woken once per
    batch, not once per record; a wait costs one asyncio future however many
    records it covers, and one sweep every :data:`_SWEEP_S` bounds every wait
    (instead of a timer per wait). Under load this is most of the asyncio
    producer's per-transaction cost.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, pump: DeliveryPump, timeout_s: float) -> None:
        self.loop = loop
        self._pump = pump
        self._timeout_s = timeout_s
        self._arrived: deque[tuple[_Ack, Any, Any]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._waiting: set[_Wait] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def write(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Headers | None
    ) -> _Ack:
        """Enqueue one record (a transaction's :data:`~txbridge.producer.transaction.RecordWriter`)."""
        ack = _Ack()
        error = self._pump.send(
            topic, partition, key, value, headers=headers, on_delivery=partial(self._arrive, ack)
        )
        if error is not None:
            ack.done, ack.error = True, error
        return ack

    def _arrive(self, ack: _Ack, err: Any, msg: Any) -> None:
        # On the delivery thread: queue the report; wake the loop unless a drain is already due.
        self._arrived.append((ack, err, msg))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        # A closed loop has nobody waiting; never raise into librdkafka's callback.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
        arrived = self._arrived
        while arrived:
            ack, err, msg = arrived.popleft()
            if ack.done:
                continue  # timed out meanwhile
            ack.done = True
            if err is not None:
                ack.error = delivery_error(err, msg)
            wait = ack.wait
            if wait is not None:
                wait.outstanding -= 1
                if not wait.outstanding:
                    self._release(wait)

    def _release(self, wait: _Wait) -> None:
        self._waiting.discard(wait)
        if not wait.future.done():
            wait.future.set_result(None)

    def pending(self, acks: list[_Ack]) -> asyncio.Future[None] | None:
        """A future resolved once every record of ``acks`` has reported or timed out (``None``:
        all have already). Then :func:`_failures` tells which failed."""
        outstanding = [ack for ack in acks if not ack.done]
        if not outstanding:
            return None
        future = self.loop.create_future()
        wait = _Wait(future, outstanding, self.loop.time() + self._timeout_s)
        for ack in outstanding:
            ack.wait = wait
        self._waiting.add(wait)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(_SWEEP_S, self._sweep)
        return future

    async def wait(self, acks: list[_Ack]) -> list[BaseException]:
        """Wait for every record (bounded); the failures in record order (a timeout counts as one)."""
        pending = self.pending(acks)
        if pending is not None:
            await pending
        return _failures(acks)

    def _sweep(self) -> None:
        """Fail the records of waits past their deadline, forget cancelled waits; runs while any wait."""
        now = self.loop.time()
        for wait in [w for w in self._waiting if w.deadline <= now or w.future.done()]:
            for ack in wait.acks:
                if not ack.done:
                    ack.done = True
                    ack.error = KafkaOperationError(
                        f"a record was not acknowledged within {self._timeout_s:.0f}s", retriable=True
                    )
            self._release(wait)
        self._sweeper = self.loop.call_later(_SWEEP_S, self._sweep) if self._waiting else None


def _failures(acks: list[_Ack]) -> list[BaseException]:
    return [ack.error for ack in acks if ack.error is not None]


#: The most decisions one batch record holds (about 60 bytes each: a batch stays far below
#: ``message.max.bytes`` however many transactions an application runs at once).
_MAX_BATCH = 1000


class _OpBatches:
    """The decisions of one turn of the event loop: one op record per op partition.

    Under load, transactions end together: their half records' reports arrive in one drain
    of the :class:`_AckBridge`, so they resume, run their local transactions and decide in one
    turn of the loop. Their decisions then share one op record (a batch,
    :func:`txbridge.wire.decode_ops`), one produce and one delivery report; a transaction
    deciding alone writes the one-decision record as before. Each transaction waits on a future
    of its own, resolved with the record's acknowledgement, so cancelling one cancels no other.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, bridge: _AckBridge, settings: ProducerSettings
    ) -> None:
        self._loop = loop
        self._bridge = bridge
        self._encoder = settings.encoder
        self._topic = settings.op_topic
        self._due: dict[int, list[tuple[Decision, asyncio.Future[_Ack]]]] = {}

    def submit(self, partition: int, decision: Decision) -> asyncio.Future[_Ack]:
        """Write ``decision`` to op partition ``partition`` at the end of this turn; the future
        resolves with the record's acknowledgement (its ``error`` set when it failed)."""
        future: asyncio.Future[_Ack] = self._loop.create_future()
        due = self._due.get(partition)
        if due is None:
            if not self._due:
                self._loop.call_soon(self._flush)
            due = self._due[partition] = []
        due.append((decision, future))
        return future

    def _flush(self) -> None:
        due, self._due = self._due, {}
        for partition, entries in due.items():
            for start in range(0, len(entries), _MAX_BATCH):
                self._write(partition, entries[start : start + _MAX_BATCH])

    def _write(self, partition: int, entries: list[tuple[Decision, asyncio.Future[_Ack]]]) -> None:
        futures = [future for _, future in entries]
        try:
            key, value = self._encoder.decisions([decision for decision, _ in entries])
            ack = self._bridge.write(self._topic, partition, key, value, None)
            pending = self._bridge.pending([ack])
        except Exception as exc:  # raised in each waiting transaction, as an unbatched write would
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        if pending is None:
            _resolve(futures, ack)
        else:
            pending.add_done_callback(partial(_after, futures, ack))


def _after(futures: list[asyncio.Future[_Ack]], ack: _Ack, _done: asyncio.Future[None]) -> None:
    _resolve(futures, ack)


def _resolve(futures: list[asyncio.Future[_Ack]], ack: _Ack) -> None:
    for future in futures:
        if not future.done():  # cancelled with its transaction's task
            future.set_result(ack)


#: How often waits are checked against their deadline (the bound is ``ack_timeout_s`` + this).
_SWEEP_S = 0.5


class AsyncTransactionProducer(ProducerSurface):
    """The asyncio counterpart of :class:`~txbridge.producer.TransactionProducer`.

    Takes the same arguments (see :class:`~txbridge.producer.TransactionProducer`; each option
    is described in :class:`~txbridge.ProducerOptions`) and raises the same errors. Use
    ``async with producer:`` (or ``await start()`` / ``await close()``).
    """

    def __init__(self, bootstrap: str, group: str, **options: Unpack[ProducerOptions]) -> None:
        super().__init__(bootstrap, group, options)
        self._bridge: _AckBridge | None = None
        self._ops: _OpBatches | None = None

    def _open(self, order_key: Any = None) -> AsyncTransaction:
        """A new transaction whose records report to the running loop."""
        loop = asyncio.get_running_loop()
        runtime = self._runtime
        bridge, ops = self._bridge, self._ops
        if bridge is None or ops is None or bridge.loop is not loop:
            bridge = self._bridge = _AckBridge(loop, runtime.pump, runtime.ack_timeout_s)
            ops = self._ops = _OpBatches(loop, bridge, runtime.settings)
        return AsyncTransaction(runtime, bridge, ops, order_key)

    async def start(self) -> None:
        """See :meth:`TransactionProducer.start`."""
        await asyncio.to_thread(self._runtime.start)

    async def close(self) -> None:
        """See :meth:`TransactionProducer.close`."""
        await asyncio.to_thread(self._runtime.close)

    async def __aenter__(self) -> AsyncTransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send_in_transaction(
        self,
        message: Message | Sequence[Message],
        execute: ExecuteFunction | None = None,
        arg: Any = None,
    ) -> TransactionResult:
        """See :meth:`TransactionProducer.send_in_transaction`; ``execute`` may be ``async``."""
        runtime = self._runtime
        run = runtime.execute_of(execute)
        messages = normalise_messages(message)
        if runtime.needs_listing(messages):  # not _know_topics(): no coroutine on the hot path
            await asyncio.to_thread(runtime.know_topics, messages)
        tx = self._open()
        tx.enqueue(messages)
        halves = tx.take_pending()
        pending = tx.bridge.pending(halves)  # the hot path: bridge.wait() without its coroutine
        if pending is not None:
            await pending
        tx.settle(_failures(halves))
        if tx.half_error is not None:
            state, error, reason = tx.half_failure()
            return await tx._finish(state, error, reason=reason)
        with tracing.current(tx.trace):  # the application's spans in the local transaction are its children
            state, error = await run_local_async(run, tx.local, arg)
        return await tx._finish(state, error)

    def transaction(self, order_key: Any = None) -> AsyncTransaction:
        """See :meth:`TransactionProducer.transaction`: ``async with producer.transaction() as tx``."""
        return self._open(order_key)


async def _know_topics(runtime: ProducerRuntime, messages: Sequence[Message]) -> None:
    """Make the catalog answer for the topics of ``messages``; a listing runs in a worker thread."""
    if runtime.needs_listing(messages):
        await asyncio.to_thread(runtime.know_topics, messages)


class AsyncTransaction(ProducerTransaction[_Ack]):
    """``async with producer.transaction() as tx``: see :class:`txbridge.producer.Transaction`."""

    __slots__ = ("_ops", "_runtime", "bridge")

    def __init__(
        self, runtime: ProducerRuntime, bridge: _AckBridge, ops: _OpBatches, order_key: Any = None
    ) -> None:
        runtime.require_started()
        settings = runtime.settings
        super().__init__(settings, runtime.catalog, bridge.write, order_key_bytes(settings, order_key))
        self._runtime = runtime
        #: Where this transaction's delivery reports reach its event loop.
        self.bridge = bridge
        self._ops = ops

    async def send(self, message: Message | Sequence[Message], *, wait: bool = True) -> None:
        """Write ``message`` (or each of a sequence, in order) as a half record; by default
        return once acknowledged.

        Raises:
            MessageRejectedError: see :meth:`txbridge.producer.Transaction.send` (not written).
        """
        messages = normalise_messages(message)
        await _know_topics(self._runtime, messages)
        self.enqueue(messages)
        if wait:
            await self.prepare()

    async def prepare(self) -> None:
        """Wait until every half record sent so far is acknowledged.

        Raises:
            KafkaOperationError: one was not; the transaction can only roll back.
        """
        self.settle_or_raise(await self.bridge.wait(self.take_pending()))

    async def __aenter__(self) -> AsyncTransaction:
        self._traced = tracing.current(self.trace)
        self._traced.__enter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.settle(await self.bridge.wait(self.take_pending()))
        state, error, reason, to_raise = self.exit_decision(exc)
        await self._finish(state, error, reason=reason)
        self._traced.__exit__(exc_type, exc, tb)
        if to_raise is not None:
            raise to_raise from None

    async def _finish(
        self, state: TxState, error: BaseException | None, *, reason: str = ""
    ) -> TransactionResult:
        """Settle an UNKNOWN with a decisive check, write the op record, wait for it."""
        runtime = self._runtime
        if state is TxState.UNKNOWN and runtime.settles_unknown and self.partition is not None:
            settled = await settle_unknown_async(runtime.check, self.local)
            if settled is not TxState.UNKNOWN:
                state, reason = settled, SETTLED_REASON
        decision = self.conclude(state, reason=reason)
        if decision is None or self.partition is None:
            return self.outcome(state, error, ())
        ack = await self._ops.submit(self.partition, decision)
        return self.outcome(state, error, (ack.error,) if ack.error is not None else ())
