"""The concurrent consumer: a worker pool, a retry topic with growing delays, a dead-letter topic.

A failed message is copied to the group's retry topic (``<ns>_retry-<group>``)
with ``txb.retry`` (the retry number) and ``txb.due`` (when it may run again)
and its offset counts as processed, so the main flow never waits for it. The
consumer also reads its retry topic and holds each retry record in memory until
it is due; past ``retry_hold_limit`` held records the retry partition is paused.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Unpack

from txbridge import kafka
from txbridge.consumer._loop import TP, ConsumerLoop, ConsumerOptions, call_listener
from txbridge.consumer.dlq import dead_letter_headers, retry_headers
from txbridge.consumer.model import (
    ConcurrentContext,
    ConcurrentListener,
    ConsumeConcurrentlyStatus,
    ConsumedMessage,
)
from txbridge.consumer.offsets import OffsetTracker
from txbridge.consumer.records import due_ms, raw_origin, raw_user_headers, to_consumed
from txbridge.consumer.retry import RetryPolicy
from txbridge.errors import ConfigurationError, WireFormatError

logger = logging.getLogger(__name__)


class ConcurrentConsumer(ConsumerLoop[ConcurrentListener]):
    """RocketMQ's concurrent consumer on Kafka (``read_committed``, at-least-once).

    Messages run on a pool of ``workers`` threads, in no particular order. The
    listener ``(message, context)`` returns
    :attr:`ConsumeConcurrentlyStatus.CONSUME_SUCCESS` or
    :attr:`~ConsumeConcurrentlyStatus.RECONSUME_LATER` (raising counts as
    RECONSUME_LATER). A failed message goes to the retry topic and comes back
    after ``retry_policy.delay_for(n)`` (RocketMQ's 10s, 30s, 1m, ... 2h by
    default; ``context.delay_s`` overrides one delay); after
    ``retry_policy.max_reconsume`` retries (16) it goes to the dead-letter topic.

    Per partition, offsets are committed only below the lowest unfinished message.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the consumer group.
        topics: topic or topics to subscribe to.
        listener: ``(ConsumedMessage, ConcurrentContext) -> ConsumeConcurrentlyStatus``.
        workers: listener threads.
        retry_policy: delays and the retry limit.
        retry_partitions: partitions of the retry topic when it is created.
        max_in_flight: unfinished messages per partition before it is paused.
        retry_hold_limit: retry records held in memory per retry partition before it is paused.
        **options: the settings both consumers take (:class:`ConsumerOptions`):
            ``subscription``, ``namespace``, ``commit_interval_s``, ``shutdown_timeout_s``
            (how long close/revocation waits for running listeners), ``client_config``,
            ``extra_config``.

    Raises:
        ConfigurationError: a bad subscription expression, group, topic, listener or bound.
    """

    listener_signature = "(message, context) -> ConsumeConcurrentlyStatus"

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str] | str,
        listener: ConcurrentListener,
        *,
        workers: int = 8,
        retry_policy: RetryPolicy | None = None,
        retry_partitions: int = 1,
        max_in_flight: int = 1000,
        retry_hold_limit: int = 1000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(bootstrap, group, topics, listener, **options)
        if workers < 1 or max_in_flight < 1 or retry_hold_limit < 1 or retry_partitions < 1:
            raise ConfigurationError(
                "workers, max_in_flight, retry_hold_limit and retry_partitions must be >= 1"
            )
        self.retry_topic = self.names.retry(group)
        if self.retry_topic in self.topics:
            raise ConfigurationError(
                f"do not subscribe to {self.retry_topic}: the consumer reads it by itself"
            )
        self._policy = retry_policy or RetryPolicy()
        self._workers = workers
        self._retry_partitions = retry_partitions
        self._max_in_flight = max_in_flight
        self._retry_hold_limit = retry_hold_limit
        self._pool: ThreadPoolExecutor | None = None
        self._trackers: dict[TP, OffsetTracker] = {}
        self._futures: dict[TP, set[Future[None]]] = {}
        self._done: queue.SimpleQueue[tuple[TP, int, OffsetTracker]] = queue.SimpleQueue()
        self._held: list[tuple[int, int, TP, Any]] = []  # heap of (due ms, tie, tp, record)
        self._held_count: dict[TP, int] = {}
        self._tie = itertools.count()

    # ------------------------------------------------------------------ set-up

    def _ensure_topics(self) -> None:
        kafka.ensure_topics(
            self.bootstrap,
            [
                kafka.TopicSpec(self.dead_letter_topic),
                kafka.TopicSpec(self.retry_topic, self._retry_partitions),
            ],
            extra=kafka.settings_for("admin", self._extra),
        )

    def _subscribed_topics(self) -> list[str]:
        return [*self.topics, self.retry_topic]

    def _open(self) -> None:
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=f"txb-{self.group}")
        super()._open()

    # ------------------------------------------------------------------ the poll thread

    def _handle(self, tp: TP, msg: Any) -> None:
        tracker = self._trackers.get(tp)
        if tracker is None:
            return
        tracker.start(msg.offset())
        if tp[0] == self.retry_topic:
            try:
                due = due_ms(msg)
            except WireFormatError:
                due = 0  # the task moves it to the dead-letter topic
            if due > time.time() * 1000:
                heapq.heappush(self._held, (due, next(self._tie), tp, msg))
                self._held_count[tp] = self._held_count.get(tp, 0) + 1
                return
        self._submit(tp, msg)

    def _submit(self, tp: TP, msg: Any) -> None:
        assert self._pool is not None
        future = self._pool.submit(self._process, msg, tp[0] == self.retry_topic)
        self._futures.setdefault(tp, set()).add(future)
        offset, tracker = msg.offset(), self._trackers[tp]
        future.add_done_callback(lambda f: self._finished(tp, offset, tracker, f))

    def _finished(self, tp: TP, offset: int, tracker: OffsetTracker, future: Future[None]) -> None:
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or isinstance(error, InterruptedError):
            # Stopped before it was processed: it stays unfinished and is replayed.
            self._done.put((tp, -1, tracker))
        elif error is not None:
            # A bug, not a listener failure (those are caught): never commit past it.
            logger.error("%s/%d@%d failed outside the listener", *tp, offset, exc_info=error)
            self._done.put((tp, -1, tracker))
        else:
            self._done.put((tp, offset, tracker))

    def _tick(self) -> None:
        self._drain_done()
        now_ms = time.time() * 1000
        while self._held and self._held[0][0] <= now_ms:
            _, _, tp, msg = heapq.heappop(self._held)
            if tp in self._trackers:
                self._held_count[tp] -= 1
                self._submit(tp, msg)

    def _drain_done(self) -> None:
        while True:
            try:
                tp, offset, tracker = self._done.get_nowait()
            except queue.Empty:
                return
            # A late completion from before a rebalance must not finish the new owner's offset.
            if offset >= 0 and self._trackers.get(tp) is tracker:
                tracker.finish(offset)
            futures = self._futures.get(tp)
            if futures:
                for future in [f for f in futures if f.done()]:
                    futures.discard(future)

    def _want_paused(self, tp: TP) -> bool:
        tracker = self._trackers.get(tp)
        if tracker is None:
            return False
        if tp[0] == self.retry_topic and self._held_count.get(tp, 0) >= self._retry_hold_limit:
            return True
        return tracker.in_flight >= self._max_in_flight

    def _committable(self) -> dict[TP, int]:
        offsets = {}
        for tp, tracker in self._trackers.items():
            offset = tracker.committable()
            if offset is not None:
                offsets[tp] = offset
        return offsets

    # ------------------------------------------------------------------ rebalances and shutdown

    def _partitions_assigned(self, tps: set[TP]) -> None:
        for tp in tps:
            self._trackers[tp] = OffsetTracker()

    def _partitions_revoked(self, tps: set[TP], timeout_s: float) -> None:
        running = [f for tp in tps for f in self._futures.get(tp, ())]
        if running:
            wait(running, timeout=timeout_s)
        self._drain_done()

    def _forget(self, tps: set[TP]) -> None:
        super()._forget(tps)
        for tp in tps:
            self._trackers.pop(tp, None)
            self._futures.pop(tp, None)
            self._held_count.pop(tp, None)
        self._held = [entry for entry in self._held if entry[2] not in tps]
        heapq.heapify(self._held)

    def _stop_processing(self, timeout_s: float) -> None:
        running = [f for futures in self._futures.values() for f in futures]
        if running:
            wait(running, timeout=timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._drain_done()

    # ------------------------------------------------------------------ on a pool thread

    def _process(self, msg: Any, is_retry: bool) -> None:
        try:
            message = to_consumed(msg, is_retry=is_retry)
            if is_retry:
                due_ms(msg)
        except WireFormatError as exc:
            self._aside(
                self.dead_letter_topic,
                msg,
                dead_letter_headers(raw_user_headers(msg), raw_origin(msg, None), 0, f"malformed: {exc}"),
            )
            return
        if not self.subscription.matches(message.tag):
            return
        context = ConcurrentContext(attempt=message.reconsume_times + 1)
        if self._call(message, context):
            return
        retries = message.reconsume_times
        origin = raw_origin(msg, message)
        if self._policy.exhausted(retries):
            reason = f"failed {retries + 1} times (concurrent)"
            logger.warning("%s goes to %s: %s", origin, self.dead_letter_topic, reason)
            self._aside(
                self.dead_letter_topic,
                msg,
                dead_letter_headers(raw_user_headers(msg), origin, retries, reason),
            )
            return
        retry = retries + 1
        due = self._policy.due_ms(retry, time.time())
        if context.delay_s is not None:
            due = int((time.time() + max(context.delay_s, 0.0)) * 1000) + 1
        self._aside(self.retry_topic, msg, retry_headers(raw_user_headers(msg), origin, retry, due))

    def _call(self, message: ConsumedMessage, context: ConcurrentContext) -> bool:
        return call_listener(
            self._listener,
            message,
            context,
            success=ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
            failure=ConsumeConcurrentlyStatus.RECONSUME_LATER,
            then="reconsuming later",
        )

    def _aside(self, topic: str, msg: Any, headers: list[tuple[str, bytes]]) -> None:
        assert self.forwarder is not None
        if not self.forwarder.send(topic, msg.key(), msg.value(), headers):
            raise InterruptedError("stopped before the copy was acknowledged")
