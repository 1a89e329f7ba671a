"""Ordered sends: a queue selector that fixes the partition (RocketMQ's ``MessageQueueSelector``).

Messages with the same key go to the same partition, so an orderly consumer
sees them in send order. The default selector is Kafka's own partitioner
(murmur2 of the key, as the Java client does), so txbridge and plain Kafka
producers agree on where a key lives.

With the transactional producer, fill ``Message.partition``::

    count = ...  # partitions of the real topic
    msg = Message("orders", value, key=b"order-42")
    msg = dataclasses.replace(msg, partition=select_partition(msg, count))
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from txbridge import kafka
from txbridge.client_config import ClientConfig
from txbridge.consumer.tags import validate_tag
from txbridge.errors import ConfigurationError, KafkaOperationError
from txbridge.kafka import Producer
from txbridge.wire import H_TAGS, murmur2

logger = logging.getLogger(__name__)

#: ``(message, arg, partition_count) -> partition``; ``message`` has ``.topic``, ``.key``, ``.value``.
Selector = Callable[[Any, Any, int], int]


@dataclass(frozen=True)
class OrderedMessage:
    """A message for :class:`OrderedProducer`, as a selector sees it."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    tags: str | None = None


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def hash_selector(message: Any, arg: Any, partition_count: int) -> int:
    """Kafka's default partitioner on the key (or on ``str(arg)`` when the message has no key).

    Raises:
        ConfigurationError: neither a key nor an arg to order by.
    """
    key = getattr(message, "key", None)
    if key is None and arg is None:
        raise ConfigurationError("an ordered send needs a key, an arg or a selector to pick the partition")
    data = _as_bytes(key if key is not None else arg)
    return (murmur2(data) & 0x7FFFFFFF) % partition_count


def select_partition(
    message: Any, partition_count: int, *, selector: Selector | None = None, arg: Any = None
) -> int:
    """The partition of ``message`` among ``partition_count``, by ``selector`` (default: key hash).

    Raises:
        ConfigurationError: the selector's answer is not a partition in ``[0, partition_count)``.
    """
    if partition_count < 1:
        raise ConfigurationError(f"partition_count must be >= 1, got {partition_count}")
    chosen = (selector or hash_selector)(message, arg, partition_count)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < partition_count:
        raise ConfigurationError(
            f"the queue selector returned {chosen!r}; it must be an int in [0, {partition_count})"
        )
    return chosen


class OrderedProducer:
    """Plain (non-transactional) ordered sends: idempotent, ``acks=all``.

    Use as a context manager, or call :meth:`start` and :meth:`close`
    (which flushes). Sends are asynchronous; :meth:`flush` waits for them and
    raises if any failed.

    Args:
        bootstrap: Kafka bootstrap servers.
        selector: default queue selector (Kafka's key hash when None).
        client_config: the cluster's client settings (security), as
            :class:`~txbridge.producer.TransactionProducer` takes them.
        extra_config: librdkafka settings passed through (on top of ``client_config``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        selector: Selector | None = None,
        client_config: ClientConfig | Mapping[str, Any] | None = None,
        extra_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._selector = selector
        self._extra = {**ClientConfig.coerce(client_config).librdkafka(), **(extra_config or {})}
        self._producer: Producer | None = None
        self._counts: dict[str, int] = {}
        self._errors: list[KafkaOperationError] = []
        self._lock = threading.Lock()

    def start(self) -> OrderedProducer:
        if self._producer is None:
            self._producer = kafka.producer(self._bootstrap, self._extra)
        return self

    def __enter__(self) -> OrderedProducer:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close()

    def partition_count(self, topic: str, timeout: float = 10.0) -> int:
        """Partitions of ``topic`` (looked up once, then cached).

        Raises:
            ConfigurationError: the topic does not exist.
        """
        if topic not in self._counts:
            meta = (
                kafka.opened(self.start()._producer, "the producer")
                .list_topics(topic, timeout=timeout)
                .topics.get(topic)
            )
            if meta is None or meta.error is not None or not meta.partitions:
                raise ConfigurationError(f"topic {topic} does not exist: create it before ordered sends")
            self._counts[topic] = len(meta.partitions)
        return self._counts[topic]

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        headers: Sequence[tuple[str, bytes]] | None = None,
        tags: str | None = None,
        arg: Any = None,
        selector: Selector | None = None,
    ) -> int:
        """Send one message to the partition its selector picks; return that partition.

        Raises:
            ConfigurationError: a bad tag, no key/arg/selector, or a selector answering out of range.
        """
        all_headers = list(headers or ())
        if tags is not None:
            all_headers.append((H_TAGS, validate_tag(tags).encode("utf-8")))
        message = OrderedMessage(topic, value, key, tuple(all_headers), tags)
        partition = select_partition(
            message, self.partition_count(topic), selector=selector or self._selector, arg=arg
        )
        producer = kafka.opened(self._producer, "the producer")  # started by partition_count
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=cast("kafka.Headers", all_headers),
            partition=partition,
            on_delivery=self._delivered,
        )
        producer.poll(0)
        return partition

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            error = kafka.to_error(err, f"ordered send to {msg.topic()}")
            logger.error("%s", error)
            with self._lock:
                self._errors.append(error)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every send is acknowledged.

        Raises:
            KafkaOperationError: a send failed, or some were not acknowledged in time.
        """
        if self._producer is None:
            return
        left = self._producer.flush(timeout)
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise KafkaOperationError(f"{len(errors)} ordered sends failed; first: {errors[0]}")
        if left:
            raise KafkaOperationError(f"{left} ordered sends not acknowledged within {timeout}s")

    def close(self, timeout: float = 30.0) -> None:
        """Flush and release the producer."""
        try:
            self.flush(timeout)
        finally:
            self._producer = None
