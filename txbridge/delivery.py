"""One Kafka producer shared by many transactions, with delivery reports routed to futures.

Every record gets a ``concurrent.futures.Future`` resolved by the delivery
report; a background thread polls the producer. Nothing flushes per message, so
records of concurrent transactions batch together (``linger.ms``), and a caller
waits only for its own records.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any, NamedTuple, cast

from txbridge import kafka
from txbridge.errors import KafkaOperationError, TransactionStateError
from txbridge.kafka import Producer
from txbridge.wire import Headers

logger = logging.getLogger(__name__)

DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
#: linger.ms of the second producer that writes the ``urgent_topics`` (the op records). An op
#: record is a single write its caller waits for, and nothing is published before it, so its
#: linger is added whole to every transaction's commit-to-visible. Half records and heartbeats
#: keep linger 5: batching them saves produce requests and end-to-end throughput. 1, not 0: at
#: saturation linger 0 sent an op record a produce request of its own nearly every time, which
#: cost the broker more CPU per message than the coordinator's whole Kafka transaction and
#: took a fifth of the throughput; 1 ms costs light load about 1.5 ms of p50
#: (docs/results/settings.md).
URGENT_LINGER_MS = 1


class Delivered(NamedTuple):
    partition: int
    offset: int


#: librdkafka's delivery callback: ``(error or None, message)``, run on the delivery thread.
OnDelivery = Callable[[Any, Any], None]


class DeliveryPump:
    """An idempotent, acks=all producer plus the thread that serves its delivery reports.

    Args:
        bootstrap: Kafka bootstrap servers.
        extra_config: librdkafka settings on top of txbridge's defaults.
        poll_interval_s: how long one poll waits for reports.
        urgent_topics: topics written by a second producer with ``linger.ms`` =
            :data:`URGENT_LINGER_MS` (its own delivery thread), for records a caller waits on alone.

    No I/O until :meth:`start`.
    """

    def __init__(
        self,
        bootstrap: str,
        extra_config: dict[str, Any] | None = None,
        *,
        poll_interval_s: float = 0.05,
        urgent_topics: Collection[str] = (),
    ) -> None:
        self._bootstrap = bootstrap
        self._extra = dict(extra_config or {})
        self._poll_interval_s = poll_interval_s
        self._message_timeout_s = (
            float(self._extra.get("message.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS)) / 1000
        )
        self._producer: Producer | None = None
        self._urgent_topics = frozenset(urgent_topics)
        self._urgent: Producer | None = None  # the producer of the urgent topics
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def message_timeout_s(self) -> float:
        """librdkafka's bound on a delivery report (``message.timeout.ms``)."""
        return self._message_timeout_s

    def start(self) -> None:
        if self._producer is not None:
            raise TransactionStateError("the delivery pump is already started")
        # Half and op records must not be reordered or duplicated: idempotence + acks=all
        # (the defaults of kafka.producer); extra_config may tune batching and timeouts.
        self._producer = kafka.producer(
            self._bootstrap, self._extra, message_timeout_ms=DEFAULT_MESSAGE_TIMEOUT_MS
        )
        producers = [self._producer]
        if self._urgent_topics:
            urgent = {**self._extra, "linger.ms": URGENT_LINGER_MS}
            self._urgent = kafka.producer(
                self._bootstrap, urgent, message_timeout_ms=DEFAULT_MESSAGE_TIMEOUT_MS
            )
            producers.append(self._urgent)
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._serve, args=(p,), name="txbridge-delivery", daemon=True)
            for p in producers
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self, producer: Producer) -> None:
        while not self._stop.is_set():
            producer.poll(self._poll_interval_s)

    def list_topics(self, timeout: float) -> dict[str, int | None]:
        """``{topic: partition count}`` of the cluster's topics (metadata through the producer)."""
        try:
            metadata = kafka.opened(self._producer, "the producer").list_topics(timeout=timeout)
        except Exception as exc:  # KafkaException: translated, with its classification
            raise kafka.to_error(exc, "reading topic metadata") from exc
        return {
            name: (None if topic.error is not None else len(topic.partitions))
            for name, topic in metadata.topics.items()
        }

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: list[tuple[str, bytes]] | None,
        on_delivery: OnDelivery,
    ) -> KafkaOperationError | None:
        """Enqueue one record; librdkafka calls ``on_delivery(err, msg)`` on the delivery thread.

        The hot path: no future, nothing allocated beyond what the caller passes.

        Returns:
            The error when the record could not even be enqueued (then no report follows);
            ``None`` once it is enqueued. Never raises for Kafka errors.

        Raises:
            TransactionStateError: the pump is not started.
        """
        urgent = self._urgent is not None and topic in self._urgent_topics
        producer = self._urgent if urgent else self._producer
        if producer is None:
            raise TransactionStateError("the producer is not started: call start() or use `with producer:`")
        deadline = 0.0
        while True:
            try:
                producer.produce(
                    topic, value, key, partition, on_delivery, headers=cast("kafka.Headers | None", headers)
                )
            except BufferError:
                # The local queue is full: the poll thread drains it; wait, bounded.
                now = time.monotonic()
                deadline = deadline or now + self._message_timeout_s
                if now > deadline:
                    return KafkaOperationError(
                        f"producing to {topic}: local queue stayed full for {self._message_timeout_s:.0f}s",
                        retriable=True,
                    )
                time.sleep(0.01)
            except Exception as exc:  # KafkaException (unknown partition, too large...): the record failed
                return kafka.to_error(exc, f"producing to {topic}[{partition}]")
            else:
                return None

    def produce(
        self,
        topic: str,
        *,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = (),
    ) -> Future[Delivered]:
        """Enqueue one record; the future resolves when Kafka acknowledges it (or fails with
        :class:`~txbridge.errors.KafkaOperationError`). Never raises for Kafka errors."""
        future: Future[Delivered] = Future()
        error = self.send(
            topic,
            partition,
            key,
            value,
            headers=list(headers) if headers else None,
            on_delivery=partial(_report, future),
        )
        if error is not None:
            future.set_exception(error)
        return future

    def write(
        self, topic: str, partition: int, key: bytes, value: bytes | None, headers: Headers | None
    ) -> Future[Delivered]:
        """:meth:`produce` as a transaction's record writer (positional: a
        :data:`~txbridge.producer.transaction.RecordWriter`)."""
        return self.produce(topic, partition=partition, key=key, value=value, headers=headers)

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop the poll thread."""
        if self._producer is None:
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        remaining = sum(p.flush(timeout) for p in (self._urgent, self._producer) if p is not None)
        if remaining:
            logger.warning("%d records were not delivered within %.0fs of closing", remaining, timeout)
        self._producer = self._urgent = None
        self._threads = []


def delivery_error(err: Any, msg: Any) -> KafkaOperationError:
    """A failed delivery report as txbridge's error, naming where the record was going."""
    return kafka.to_error(err, f"writing to {msg.topic()}[{msg.partition()}]")


def _report(future: Future[Delivered], err: Any, msg: Any) -> None:
    if future.done():  # defensive: a report arrives once, but never raise in librdkafka's callback
        return
    if err is not None:
        future.set_exception(delivery_error(err, msg))
    else:
        future.set_result(Delivered(msg.partition(), msg.offset()))


def wait_all(futures: Sequence[Future[Delivered]], timeout: float) -> list[BaseException]:
    """Wait for every future (bounded); the failures, in order (a timeout counts as one)."""
    deadline = time.monotonic() + timeout
    failures: list[BaseException] = []
    for future in futures:
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            failures.append(
                KafkaOperationError(f"a record was not acknowledged within {timeout:.0f}s", retriable=True)
            )
        except KafkaOperationError as exc:
            failures.append(exc)
    return failures
