"""txbridge's producers and consumers, and what their users do with them.

The factories (:func:`producer`, :func:`consumer`) make confluent_kafka's clients with the
settings of :mod:`txbridge.kafka.config`; the helpers assign, seek, commit and read partitions
to their end (:func:`read_to_end`). Clients are typed as confluent_kafka's own classes,
re-exported here (``Consumer``, ``Producer``, ``TopicPartition``, ``Message``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from txbridge.errors import KafkaOperationError, TxBridgeError
from txbridge.kafka.config import consumer_config, producer_config
from txbridge.kafka.errors import is_partition_eof, to_error

logger = logging.getLogger(__name__)

__all__ = [
    "FROM_START",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "Consumer",
    "Headers",
    "Message",
    "Producer",
    "TopicPartition",
    "append_time_ms",
    "commit_offsets",
    "consume_available",
    "consumer",
    "init_transactions",
    "librdkafka_refusal",
    "opened",
    "partition_at",
    "producer",
    "read_to_end",
    "seek_started",
    "topic_partitions",
    "versions",
]

#: Record headers as ``Producer.produce`` takes them.
Headers = list[tuple[str, str | bytes | None]]

_Client = TypeVar("_Client", Consumer, Producer)


def opened(client: _Client | None, what: str) -> _Client:
    """``client``, made: a client used before it is made, or after it was dropped, is a bug.

    Raises:
        TxBridgeError: ``client`` is None.
    """
    if client is None:
        raise TxBridgeError(f"{what} is not open")
    return client


def producer(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Producer:
    """An idempotent, acks=all producer unless ``defaults``/``extra`` say otherwise."""
    return Producer(producer_config(bootstrap, extra, **defaults))


def init_transactions(client: Producer, timeout: float) -> None:
    """``client.init_transactions(timeout)``, after a metadata request that connects it.

    librdkafka asks for the transaction coordinator as soon as it is called; with no
    broker connection up yet it retries 500 ms later, so a cold ``init_transactions``
    waits out that retry, and a connection made first spares it. A coordinator's
    restart and a takeover's fencing both wait for it.
    """
    client.list_topics(timeout=timeout)
    client.init_transactions(timeout)


def consumer(bootstrap: str, group: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Consumer:
    """A read_committed consumer with manual offset commits unless told otherwise."""
    return Consumer(consumer_config(bootstrap, group, extra, **defaults))


def librdkafka_refusal(settings: Mapping[str, Any]) -> str | None:
    """librdkafka's complaint about ``settings`` (None: it takes them), from a throwaway producer.

    A producer takes every librdkafka setting (it ignores consumer ones). It is made without
    ``bootstrap.servers``, so it never connects; its log lines are dropped.
    """
    try:
        Producer({**settings, "log_level": 0, "logger": _QUIET})
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        return str(error.str() if isinstance(error, KafkaError) else error)
    except (TypeError, ValueError) as exc:  # a callback that is not callable, a value of a bad type
        return str(exc)
    return None


class _Quiet:
    """A librdkafka logger that drops everything (``debug`` in the settings raises the log level)."""

    def log(self, *_args: Any) -> None:
        return None


_QUIET = _Quiet()


def versions() -> dict[str, str]:
    """The versions of librdkafka and of confluent_kafka, the Python client over it."""
    return {"librdkafka": confluent_kafka.libversion()[0], "confluent_kafka": confluent_kafka.version()[0]}


# ---------------------------------------------------------------- small helpers for assign/seek users

OFFSET_BEGINNING = -2
OFFSET_END = -1
#: Where to assign a partition to read it all: offset 0, not OFFSET_BEGINNING. librdkafka
#: resolves a logical offset with a ListOffsets round first, which offset 0 skips
#: (docs/results/settings.md); a partition whose
#: start was deleted answers OFFSET_OUT_OF_RANGE and resets to its earliest offset
#: (``auto.offset.reset=earliest``, the default of :func:`consumer`).
FROM_START = 0
_TIMESTAMP_LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME


def topic_partitions(
    pairs: Iterable[tuple[str, int]], offsets: Mapping[tuple[str, int], int] | None = None
) -> list[TopicPartition]:
    """``TopicPartition`` objects for ``(topic, partition)`` pairs, with offsets when given."""
    if offsets is None:
        return [TopicPartition(topic, partition) for topic, partition in pairs]
    return [TopicPartition(topic, partition, offsets[(topic, partition)]) for topic, partition in pairs]


def commit_offsets(client: Consumer, offsets: Mapping[tuple[str, int], int]) -> None:
    """Commit ``{(topic, partition): next offset}`` synchronously.

    Raises:
        KafkaOperationError: the commit failed (e.g. the group is rebalancing).
    """
    if not offsets:
        return
    try:
        results = client.commit(offsets=topic_partitions(offsets, offsets), asynchronous=False)
    except KafkaException as exc:
        raise to_error(exc, "committing offsets") from exc
    for tp in results or ():
        if tp.error is not None:
            raise to_error(tp.error, f"committing the offset of {tp.topic}/{tp.partition}")


def consume_available(client: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """Up to ``max_messages`` records: waits up to ``timeout`` for the first, then takes only
    what is already fetched.

    ``Consumer.consume(n, timeout)`` returns early only once ``n`` records are there: with
    fewer it waits out the whole timeout, which would add up to ``timeout`` of latency to
    every record of a sparse stream.
    """
    first = client.poll(timeout)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *client.consume(max_messages - 1, 0)]


def read_to_end(
    client: Consumer,
    topic: str,
    ends: Mapping[int, int | None],
    *,
    timeout: float,
    what: str,
    late: str = "",
) -> Iterator[Message]:
    """The records of ``topic``'s partitions assigned to ``client``, until each reaches its end.

    A partition ends at ``ends[partition]``: once the consumer's position reaches that offset
    (the position moves past control records and aborted records as well), or, for None, at
    its partition-EOF event (``client`` made with ``enable_partition_eof=True``), the end it
    has when the read catches up with it (the last stable offset under read_committed).
    A partition's ``end`` must be above where it is assigned.

    Args:
        what: the read, for errors ("restoring t", "reading t").
        late: added to the timeout's error (what may hold the read back).

    Raises:
        KafkaOperationError: a consumer error, or the ends were not reached within ``timeout``.
    """
    wanted = dict(ends)
    deadline = time.monotonic() + timeout
    while wanted:
        if time.monotonic() > deadline:
            raise KafkaOperationError(
                f"{what}: partitions {sorted(wanted)} did not reach their end in {timeout:.0f}s{late}"
            )
        for msg in consume_available(client, 1000, 0.1):
            err = msg.error()
            if err is None:
                yield msg
            elif not is_partition_eof(err):
                raise to_error(err, f"{what}/{msg.partition()}")
            elif (partition := msg.partition() or 0) in wanted and wanted[partition] is None:
                del wanted[partition]
        by_offset = [partition_at(topic, p) for p, end in wanted.items() if end is not None]
        for tp in client.position(by_offset) if by_offset else ():
            end = wanted[tp.partition]
            if end is not None and tp.offset >= end:
                del wanted[tp.partition]


def partition_at(topic: str, partition: int, offset: int | None = None) -> TopicPartition:
    """One ``TopicPartition``, at ``offset`` when given (``OFFSET_BEGINNING``/``OFFSET_END`` work)."""
    return TopicPartition(topic, partition) if offset is None else TopicPartition(topic, partition, offset)


def seek_started(client: Consumer, partitions: Iterable[TopicPartition], timeout: float) -> None:
    """Seek each of ``partitions`` (assigned, perhaps just now) to its offset once its fetcher runs.

    librdkafka starts an assigned partition's fetcher when it serves the assignment, which waits
    for the previous assignment's fetchers to stop and for commits in flight: a seek before that
    fails (``_STATE``; ``_PREV_IN_PROGRESS`` while its previous fetcher stops), and is tried again
    here for up to ``timeout`` seconds. A seek that succeeds is queued behind the fetcher's start,
    so the start cannot undo it, and it raises the partition's version barrier: what was fetched
    before it is discarded, never returned by a later poll.

    A partition this client does not know (``_UNKNOWN_PARTITION``: its metadata of the topic
    lacks it, as a client made while a broker restarted was seen to have for 45 s) has its
    topic's metadata asked for, and is tried again within the same ``timeout``.

    Raises:
        KafkaException: a seek failed otherwise, or the fetcher did not start in time.
    """
    deadline = time.monotonic() + timeout
    for tp in partitions:
        while True:
            try:
                client.seek(tp)
                break
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
                if code not in (*_NOT_STARTED, KafkaError._UNKNOWN_PARTITION) or time.monotonic() > deadline:
                    raise
                if code == KafkaError._UNKNOWN_PARTITION:
                    _refresh_metadata(client, tp.topic, deadline)
                time.sleep(_SEEK_RETRY_S)


def _refresh_metadata(client: Consumer, topic: str, deadline: float) -> None:
    """Ask for ``topic``'s metadata: librdkafka updates the client's view of it from the answer."""
    try:
        client.list_topics(topic, timeout=max(0.1, min(_METADATA_TIMEOUT_S, deadline - time.monotonic())))
    except KafkaException as exc:
        logger.info("refreshing the metadata of %s: %s", topic, exc)


#: What librdkafka answers a seek of a partition whose fetcher has not started yet.
_NOT_STARTED = (KafkaError._STATE, KafkaError._PREV_IN_PROGRESS)
_SEEK_RETRY_S = 0.01
_METADATA_TIMEOUT_S = 2.0


def append_time_ms(message: Any) -> int | None:
    """The broker's append time of a consumed record, or None when the topic keeps CreateTime."""
    kind, value = message.timestamp()
    return value if kind == _TIMESTAMP_LOG_APPEND_TIME else None
