"""The asyncio transactional producer: the same protocol, awaited instead of blocked on.

It wraps a :class:`~txbridge.producer.TransactionProducer` (same constructor):
records go through the same shared Kafka producer and their delivery futures are
awaited with :func:`asyncio.wrap_future`, so the event loop never blocks on Kafka.
Start-up and shutdown (metadata, check server, registry) run in a worker thread.

``execute`` and check callbacks may be plain or ``async`` functions. A plain
``execute`` runs on the event loop thread: keep it short, or make it async.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from starlette.applications import Starlette

from txbridge._core import OpenTransaction, normalise_messages
from txbridge.delivery import Delivered
from txbridge.errors import KafkaOperationError
from txbridge.producer import ExecuteFunction, TransactionProducer, checked_answer
from txbridge.transaction import LocalTransaction, Message, TransactionResult
from txbridge.wire import TxState

logger = logging.getLogger(__name__)


class _AckBridge:
    """Hands delivery reports (completed on the delivery thread) to one event loop.

    Reports are queued and the loop is woken once per batch, not once per record:
    under load that is most of the asyncio producer's per-transaction cost.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._arrived: deque[tuple[asyncio.Future[Delivered], Future[Delivered]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def watch(self, future: Future[Delivered]) -> asyncio.Future[Delivered]:
        waiter: asyncio.Future[Delivered] = self.loop.create_future()
        future.add_done_callback(lambda done: self._arrive(waiter, done))
        return waiter

    def _arrive(self, waiter: asyncio.Future[Delivered], done: Future[Delivered]) -> None:
        self._arrived.append((waiter, done))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
        while self._arrived:
            waiter, done = self._arrived.popleft()
            if waiter.done():
                continue  # timed out meanwhile
            exc = done.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(done.result())


async def _wait_all(
    bridge: _AckBridge, futures: Sequence[Future[Delivered]], timeout: float
) -> list[BaseException]:
    """Await every delivery future (bounded); the failures in order, a timeout counting as one."""
    if not futures:
        return []
    waiters = [bridge.watch(f) for f in futures]

    def expire() -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(
                    KafkaOperationError(
                        f"a record was not acknowledged within {timeout:.0f}s", retriable=True
                    )
                )

    deadline = bridge.loop.call_later(timeout, expire)
    failures: list[BaseException] = []
    try:
        for waiter in waiters:
            try:
                await waiter
            except Exception as exc:  # KafkaOperationError from the report, or the timeout above
                failures.append(exc)
    finally:
        deadline.cancel()
    return failures


class AsyncTransactionProducer:
    """The asyncio counterpart of :class:`~txbridge.producer.TransactionProducer`.

    Takes exactly the same arguments. Use ``async with producer:`` (or
    ``await start()`` / ``await close()``).
    """

    def __init__(self, bootstrap: str, group: str, **options: Any) -> None:
        self._sync = TransactionProducer(bootstrap, group, **options)
        self._bridge: _AckBridge | None = None

    def _acks(self) -> _AckBridge:
        loop = asyncio.get_running_loop()
        if self._bridge is None or self._bridge.loop is not loop:
            self._bridge = _AckBridge(loop)
        return self._bridge

    @property
    def settings(self) -> Any:
        return self._sync.settings

    @property
    def check_app(self) -> Starlette:
        return self._sync.check_app

    @property
    def check_url(self) -> str:
        return self._sync.check_url

    @property
    def instance_id(self) -> str:
        return self._sync.instance_id

    async def start(self) -> None:
        """See :meth:`TransactionProducer.start`."""
        await asyncio.to_thread(self._sync.start)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)

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
        run = self._sync.resolve_execute(execute)
        tx = self._sync.open_transaction()
        tx.enqueue(normalise_messages(message))
        tx.settle(await _wait_all(self._acks(), tx.take_pending(), self._sync.ack_timeout_s))
        if tx.half_error is not None:
            return await self._finish(
                tx, TxState.ROLLBACK, tx.half_error, reason="half record not acknowledged"
            )
        state, error = await _run_local(run, tx.local_view(), arg)
        return await self._finish(tx, state, error)

    def transaction(self, order_key: Any = None) -> AsyncTransaction:
        """See :meth:`TransactionProducer.transaction`: ``async with producer.transaction() as tx``."""
        return AsyncTransaction(self, self._sync.open_transaction(order_key))

    async def _finish(
        self, tx: OpenTransaction, state: TxState, error: BaseException | None, *, reason: str = ""
    ) -> TransactionResult:
        future = tx.decide(state, reason=reason)
        op_failures = (
            await _wait_all(self._acks(), [future], self._sync.ack_timeout_s) if future is not None else []
        )
        if op_failures:
            logger.warning(
                "transaction %s: the %s op record was not acknowledged (%s); the back-check will decide",
                tx.tx_id,
                state,
                op_failures[0],
            )
        return tx.result(state, error, op_failures)


async def _run_local(
    execute: ExecuteFunction, txn: LocalTransaction, arg: Any
) -> tuple[TxState, BaseException | None]:
    try:
        answer = execute(txn, arg)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # RocketMQ's rule: a failed local transaction is UNKNOWN
        logger.warning(
            "local transaction %s raised %s: leaving it UNKNOWN for the back-check",
            txn.tx_id,
            type(exc).__name__,
        )
        return TxState.UNKNOWN, exc
    return checked_answer(txn, answer), None


class AsyncTransaction:
    """``async with producer.transaction() as tx``: see :class:`txbridge.producer.Transaction`."""

    def __init__(self, producer: AsyncTransactionProducer, tx: OpenTransaction) -> None:
        self._producer = producer
        self._tx = tx
        self._outcome = TxState.COMMIT
        self.result: TransactionResult | None = None

    @property
    def tx_id(self) -> str:
        return self._tx.tx_id

    @property
    def partition(self) -> int | None:
        return self._tx.partition

    @property
    def local(self) -> LocalTransaction:
        return self._tx.local_view()

    async def send(self, message: Message, *, wait: bool = True) -> None:
        """Write ``message`` as a half record; by default return once it is acknowledged."""
        self._tx.enqueue([message])
        if wait:
            await self.prepare()

    async def prepare(self) -> None:
        """Wait until every half record sent so far is acknowledged.

        Raises:
            KafkaOperationError: one was not; the transaction can only roll back.
        """
        self._tx.settle(
            await _wait_all(
                self._producer._acks(), self._tx.take_pending(), self._producer._sync.ack_timeout_s
            )
        )
        if self._tx.half_error is not None:
            raise self._tx.half_error

    def set_outcome(self, state: TxState) -> None:
        """What a clean exit writes: COMMIT (default), ROLLBACK, or UNKNOWN."""
        self._outcome = TxState(state)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            try:
                await self.prepare()
            except KafkaOperationError as err:
                self.result = await self._producer._finish(
                    self._tx, TxState.ROLLBACK, err, reason="half record not acknowledged"
                )
                raise err from None
            self.result = await self._producer._finish(self._tx, self._outcome, None)
            return
        self._tx.settle(
            await _wait_all(
                self._producer._acks(), self._tx.take_pending(), self._producer._sync.ack_timeout_s
            )
        )
        self.result = await self._producer._finish(
            self._tx,
            TxState.ROLLBACK,
            exc,
            reason=f"exception in the transaction block: {type(exc).__name__}",
        )
