"""The orderly consumer: one worker per partition, messages in offset order.

A failed message suspends only its partition (the partition is paused while
its worker waits) and is delivered again; after ``max_reconsume`` redeliveries
it goes to the group's dead-letter topic and the partition moves on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any, Unpack

from txbridge.consumer._loop import TP, ConsumerLoop, ConsumerOptions, call_listener
from txbridge.consumer.dlq import Forwarder, dead_letter_headers
from txbridge.consumer.model import ConsumedMessage, ConsumeOrderlyStatus, OrderlyContext, OrderlyListener
from txbridge.consumer.records import raw_origin, raw_user_headers, to_consumed
from txbridge.consumer.tags import Subscription
from txbridge.errors import ConfigurationError, WireFormatError

logger = logging.getLogger(__name__)

#: Redeliveries before the dead-letter topic. RocketMQ's orderly default is
#: Integer.MAX_VALUE: one poison message blocks its queue forever. 16 matches
#: the concurrent consumer; pass ``max_reconsume=None`` for RocketMQ's behaviour.
DEFAULT_MAX_RECONSUME = 16
MIN_SUSPEND_S = 0.01


class _PartitionWorker:
    """Hands one partition's messages to the listener, strictly in offset order."""

    def __init__(
        self,
        tp: TP,
        listener: OrderlyListener,
        subscription: Subscription,
        forwarder: Forwarder,
        dead_letter_topic: str,
        *,
        suspend_s: float,
        max_suspend_s: float,
        max_reconsume: int | None,
    ) -> None:
        self.tp = tp
        self._listener = listener
        self._subscription = subscription
        self._forwarder = forwarder
        self._dead_letter_topic = dead_letter_topic
        self._suspend_s = suspend_s
        self._max_suspend_s = max_suspend_s
        self._max_reconsume = max_reconsume
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        #: One past the last message processed (None before the first); read by the poll thread.
        self.processed_next: int | None = None
        #: ``time.monotonic()`` until which the partition is suspended.
        self.suspended_until = 0.0
        self._thread = threading.Thread(target=self._run, name=f"txb-orderly-{tp[0]}-{tp[1]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, msg: Any) -> None:
        self._queue.put(msg)

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    @property
    def suspended(self) -> bool:
        return time.monotonic() < self.suspended_until

    def stop(self, timeout_s: float) -> None:
        """Stop after the current listener call (a suspension ends at once)."""
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("partition %s/%d: the listener did not return within %.0fs", *self.tp, timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._queue.get()
            if msg is None or self._stop.is_set():
                return
            if self._process(msg):
                self.processed_next = msg.offset() + 1
            else:
                return  # stopped mid-message: it stays unprocessed and is replayed

    def _process(self, msg: Any) -> bool:
        try:
            message = to_consumed(msg)
        except WireFormatError as exc:
            return self._dead_letter(msg, None, 0, f"malformed: {exc}")
        if not self._subscription.matches(message.tag):
            return True  # filtered out: processed, never shown to the listener
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            context = OrderlyContext(attempt=attempt, suspend_s=self._suspend_s)
            if self._call(message, context):
                self.suspended_until = 0.0
                return True
            reconsumed = attempt - 1
            if self._max_reconsume is not None and reconsumed >= self._max_reconsume:
                return self._dead_letter(msg, message, reconsumed, f"failed {attempt} times (orderly)")
            pause = min(max(context.suspend_s, MIN_SUSPEND_S), self._max_suspend_s)
            self.suspended_until = time.monotonic() + pause
            self._stop.wait(pause)
        return False

    def _call(self, message: ConsumedMessage, context: OrderlyContext) -> bool:
        return call_listener(
            self._listener,
            message,
            context,
            success=ConsumeOrderlyStatus.SUCCESS,
            failure=ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
            then="suspending the partition",
        )

    def _dead_letter(self, msg: Any, message: ConsumedMessage | None, retries: int, reason: str) -> bool:
        logger.warning(
            "partition %s/%d@%d goes to %s: %s", *self.tp, msg.offset(), self._dead_letter_topic, reason
        )
        headers = dead_letter_headers(raw_user_headers(msg), raw_origin(msg, message), retries, reason)
        return self._forwarder.send(self._dead_letter_topic, msg.key(), msg.value(), headers)


class OrderlyConsumer(ConsumerLoop[OrderlyListener]):
    """RocketMQ's orderly consumer on Kafka (``read_committed``, at-least-once).

    Each assigned partition gets a worker thread that hands its messages to
    ``listener(message, context)`` one at a time, in offset order. The listener
    returns :attr:`ConsumeOrderlyStatus.SUCCESS`, or
    :attr:`~ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT` (raising counts
    as suspend): that partition alone is paused for ``context.suspend_s``
    (default ``suspend_s``, at most ``max_suspend_s``) and the same message is
    delivered again. After ``max_reconsume`` redeliveries the message goes to the
    group's dead-letter topic (``<ns>_dlq-<group>``) whole, with ``txb.reason``,
    ``txb.origin`` and ``txb.retry``, and the partition moves on.

    Offsets are committed only up to the last processed message, every
    ``commit_interval_s``, on revocation and on close: a crash or a rebalance
    replays a suffix and never skips a message.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the consumer group.
        topics: topic or topics to subscribe to.
        listener: ``(ConsumedMessage, OrderlyContext) -> ConsumeOrderlyStatus``.
        suspend_s: default suspend time (RocketMQ: 1 s).
        max_suspend_s: upper bound of a listener's own suspend time.
        max_reconsume: redeliveries before the dead-letter topic; None retries forever
            (RocketMQ's default, which lets one bad message block its partition).
        max_backlog: fetched messages a partition may queue before it is paused.
        **options: the settings both consumers take (:class:`ConsumerOptions`):
            ``subscription``, ``namespace``, ``commit_interval_s``, ``shutdown_timeout_s``
            (how long close/revocation waits for a running listener), ``client_config``,
            ``extra_config``.

    Raises:
        ConfigurationError: a bad subscription expression, group, topic, listener or bound.
    """

    listener_signature = "(message, context) -> ConsumeOrderlyStatus"

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str] | str,
        listener: OrderlyListener,
        *,
        suspend_s: float = 1.0,
        max_suspend_s: float = 30.0,
        max_reconsume: int | None = DEFAULT_MAX_RECONSUME,
        max_backlog: int = 1000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(bootstrap, group, topics, listener, **options)
        if not 0 < suspend_s <= max_suspend_s:
            raise ConfigurationError(
                f"suspend_s must be in (0, max_suspend_s={max_suspend_s}], got {suspend_s}"
            )
        if max_reconsume is not None and max_reconsume < 0:
            raise ConfigurationError("max_reconsume must be >= 0, or None to retry forever")
        self._suspend_s = suspend_s
        self._max_suspend_s = max_suspend_s
        self._max_reconsume = max_reconsume
        self._max_backlog = max_backlog
        self._workers: dict[TP, _PartitionWorker] = {}

    def _partitions_assigned(self, tps: set[TP]) -> None:
        assert self.forwarder is not None
        for tp in tps:
            worker = _PartitionWorker(
                tp,
                self._listener,
                self.subscription,
                self.forwarder,
                self.dead_letter_topic,
                suspend_s=self._suspend_s,
                max_suspend_s=self._max_suspend_s,
                max_reconsume=self._max_reconsume,
            )
            self._workers[tp] = worker
            worker.start()

    def _partitions_revoked(self, tps: set[TP], timeout_s: float) -> None:
        workers = [self._workers[tp] for tp in tps if tp in self._workers]
        self._stop_workers(workers, timeout_s)

    def _stop_workers(self, workers: list[_PartitionWorker], timeout_s: float) -> None:
        for worker in workers:
            worker._stop.set()  # wake every suspension first, then wait for each
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.stop(max(deadline - time.monotonic(), 0.0))

    def _forget(self, tps: set[TP]) -> None:
        super()._forget(tps)
        for tp in tps:
            self._workers.pop(tp, None)

    def _handle(self, tp: TP, msg: Any) -> None:
        worker = self._workers.get(tp)
        if worker is None:  # not ours (any more): the owner reads it from the committed offset
            return
        worker.put(msg)

    def _want_paused(self, tp: TP) -> bool:
        worker = self._workers.get(tp)
        return worker is not None and (worker.suspended or worker.backlog >= self._max_backlog)

    def _committable(self) -> dict[TP, int]:
        return {tp: w.processed_next for tp, w in self._workers.items() if w.processed_next is not None}

    def _stop_processing(self, timeout_s: float) -> None:
        self._stop_workers(list(self._workers.values()), timeout_s)
