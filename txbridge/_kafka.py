"""The one module that calls confluent_kafka directly: txbridge's Kafka layer.

Everything above it (producer semantics, consumers, coordinator, tools, pipelines) uses these
helpers, so client defaults, error translation and librdkafka logging are decided in one
place: the client factories (:func:`producer`, :func:`consumer`, :func:`admin`), which
librdkafka settings suit a client's role (:func:`settings_for`), reading partitions to
their end (:func:`read_to_end`). Clients are typed as confluent_kafka's own classes,
re-exported here (``Consumer``, ``Producer``, ``TopicPartition``, ``Message``).

Public inside the project, not to SDK users: the leading underscore keeps it out of
the SDK's API (``txbridge.__all__``); some 70 files across the packages and tests import it by
this name.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from txbridge._secrets import MASK, is_secret
from txbridge.errors import (
    ConfigurationError,
    KafkaOperationError,
    KafkaUnavailableError,
    ProducerFencedError,
    TxBridgeError,
)

logger = logging.getLogger(__name__)
_librdkafka_logger = logging.getLogger("txbridge.librdkafka")

Config = dict[str, Any]


def client_config(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Config:
    """librdkafka settings: ``defaults`` first, then the user's ``extra`` on top.

    librdkafka's own log lines go to the ``txbridge.librdkafka`` logger.
    """
    if not bootstrap:
        raise ConfigurationError(
            "no Kafka bootstrap address: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS"
        )
    config: Config = {"bootstrap.servers": bootstrap, "logger": _librdkafka_logger}
    config.update({k.replace("_", "."): v for k, v in defaults.items()})
    config.update(extra or {})
    return config


#: A client's role: which librdkafka settings of a mixed set it takes (:func:`settings_for`).
Role = Literal["producer", "consumer", "admin"]

#: Settings only a producer takes (names or name prefixes); other clients warn about them, and
#: reject ``on_delivery``.
PRODUCER_ONLY = (
    "linger.ms",
    "acks",
    "enable.idempotence",
    "message.timeout.ms",
    "delivery.",
    "batch.",
    "compression.",
    "queue.buffering",
    "partitioner",
    "sticky.partitioning",
    "transactional.id",
    "transaction.timeout.ms",
    "on_delivery",
)
#: Settings only a consumer takes (names or name prefixes): group tuning, offsets, isolation,
#: fetches; other clients warn about them, and reject ``on_commit``.
CONSUMER_ONLY = (
    "group.",
    "session.",
    "heartbeat.",
    "max.poll.",
    "auto.",
    "isolation.",
    "enable.auto",
    "enable.partition.eof",
    "fetch.",
    "partition.assignment.strategy",
    "on_commit",
)
_DROPPED: dict[Role, tuple[str, ...]] = {
    "producer": CONSUMER_ONLY,
    "consumer": PRODUCER_ONLY,
    "admin": PRODUCER_ONLY + CONSUMER_ONLY,
}


def settings_for(role: Role, settings: Mapping[str, Any]) -> Config:
    """The part of ``settings`` (librdkafka names) that a client of ``role`` takes.

    One set of client settings serves several clients (a consumer's extra config also
    makes its dead-letter producer and its admin client): a producer drops the
    consumer-only settings, a consumer the producer-only ones, an admin client both.
    The rest (connection, security, logging) goes to every client.
    """
    return {k: v for k, v in settings.items() if not k.startswith(_DROPPED[role])}


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


def to_error(err: KafkaError | KafkaException | Exception, context: str) -> KafkaOperationError:
    """Translate a confluent_kafka error into txbridge's tree, keeping its classification."""
    kerr = err.args[0] if isinstance(err, KafkaException) and err.args else err
    if not isinstance(kerr, KafkaError):
        return KafkaOperationError(f"{context}: {err}")
    if kerr.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        return ProducerFencedError(f"{context}: fenced by a newer instance ({kerr.str()})")
    return KafkaOperationError(
        f"{context}: {kerr.str()} ({kerr.name()})",
        retriable=kerr.retriable(),
        fatal=kerr.fatal(),
        txn_requires_abort=kerr.txn_requires_abort(),
        code=kerr.code(),
    )


#: retry.backoff.ms of transactional producers. A transaction that starts while the broker
#: still writes the previous one's markers gets CONCURRENT_TRANSACTIONS; librdkafka retries
#: after retry.backoff.ms, 100 ms by default. With 10: p50 / p99 commit-to-visible at
#: 2,500 msgs/s 24-33 / 85-111 ms instead of 36-102 / 259-346 ms (2 cores, Kafka 4.1.1).
TRANSACTIONAL_RETRY_BACKOFF_MS = 10

#: partitioner of every producer: murmur2 of the key, the partition Kafka's Java producer picks, so
#: txbridge and Java clients agree on where a key lives (librdkafka's default, consistent_random,
#: hashes with CRC32: on 12 partitions most keys land elsewhere). Null keys are spread, sticky for
#: sticky.partitioning.linger.ms as Java's are; an explicit partition is kept. ``extra`` may override.
PARTITIONER = "murmur2_random"


def producer(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Producer:
    """An idempotent, acks=all producer unless ``defaults``/``extra`` say otherwise."""
    return Producer(producer_config(bootstrap, extra, **defaults))


def producer_config(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Config:
    """The settings of :func:`producer`; a transactional one retries after 10 ms, not 100 ms."""
    base: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
    base["partitioner"] = PARTITIONER  # keys where Java's producer puts them
    if "transactional_id" in defaults:
        base["retry.backoff.ms"] = TRANSACTIONAL_RETRY_BACKOFF_MS
    base.update({k.replace("_", "."): v for k, v in defaults.items()})
    return client_config(bootstrap, extra, **base)


def init_transactions(client: Producer, timeout: float) -> None:
    """``client.init_transactions(timeout)``, after a metadata request that connects it.

    librdkafka asks for the transaction coordinator as soon as it is called; with no
    broker connection up yet it retries 500 ms later, so a cold ``init_transactions``
    took 0.5 s here, and the warm-up and the call together 0.1-0.2 s. A coordinator's
    restart and a takeover's fencing both wait for it.
    """
    client.list_topics(timeout=timeout)
    client.init_transactions(timeout)


def consumer(bootstrap: str, group: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Consumer:
    """A read_committed consumer with manual offset commits unless told otherwise."""
    base = {
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    base.update({k.replace("_", "."): v for k, v in defaults.items()})
    return Consumer(client_config(bootstrap, extra, **base))


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


def admin(bootstrap: str, extra: Mapping[str, Any] | None = None) -> AdminClient:
    return AdminClient(client_config(bootstrap, extra))


def check_reachable(bootstrap: str, *, timeout: float = 5.0, extra: Mapping[str, Any] | None = None) -> None:
    """Raise unless a broker answers a metadata request at ``bootstrap`` within ``timeout``.

    ``extra`` holds the client settings (security ones included): the probe connects as
    every client of the command will.

    Raises:
        KafkaUnavailableError: nothing answered; the message says what to change.
        ConfigurationError: a broker answered but refused the client: authentication or
            TLS failed (the message says which).
    """
    if not _any_listener(bootstrap):
        raise KafkaUnavailableError(
            f"no Kafka broker answers at {bootstrap} (connection refused): start one with "
            "'txbridge kafka start', or pass --bootstrap / set KAFKA_BOOTSTRAP_SERVERS"
        )
    # Quiet: a refused connection is the expected answer here, reported once below.
    errors: list[KafkaError] = []
    settings: Config = {**client_config(bootstrap, extra), "log_level": 0, "error_cb": errors.append}
    client = AdminClient(settings)
    try:
        client.list_topics(timeout=timeout)
    except KafkaException as exc:
        client.poll(0.5)  # serves the error events that say why
        raise _unreachable(bootstrap, timeout, errors, extra or {}) from exc


def _unreachable(
    bootstrap: str, timeout: float, errors: list[KafkaError], extra: Mapping[str, Any]
) -> TxBridgeError:
    """The error of a failed probe: authentication and TLS failures are named as such."""

    def reason(code: int) -> str | None:
        found = next((e.str() for e in errors if e.code() == code), None)
        if found is None:
            return None
        found = found.split("/bootstrap: ", 1)[-1]
        for name, value in extra.items():  # librdkafka does not echo secrets; make sure of it
            if is_secret(name) and str(value):
                found = found.replace(str(value), MASK)
        return found

    auth = reason(KafkaError._AUTHENTICATION)
    if auth is not None:
        return ConfigurationError(
            f"authentication failed at {bootstrap}: {auth}: check the user and password of the client "
            "settings (sasl.jaas.config, or sasl.username / sasl.password; --command-config, -X)"
        )
    tls = reason(KafkaError._SSL)
    if tls is not None:
        return ConfigurationError(
            f"TLS with the brokers at {bootstrap} failed: {tls}: check the CA of the client settings "
            "(ssl.truststore.location with ssl.truststore.type=PEM, or ssl.ca.location; --command-config, -X)"
        )
    secured = str(extra.get("security.protocol", "PLAINTEXT")).upper() != "PLAINTEXT"
    hint = "" if secured else "; a secured cluster also needs its client settings: --command-config FILE"
    return KafkaUnavailableError(
        f"no Kafka broker answers at {bootstrap} (waited {timeout:.0f}s): start one with "
        f"'txbridge kafka start', or pass --bootstrap / set KAFKA_BOOTSTRAP_SERVERS{hint}"
    )


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


def _any_listener(bootstrap: str) -> bool:
    """True when some bootstrap address accepts TCP (or cannot be probed plainly).

    A fast path: a refused connection is known at once, where librdkafka would
    retry until its timeout.
    """
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        host = host.split("://")[-1].strip("[]")
        if not host or not port.isdigit():
            return True  # let librdkafka judge an unusual address
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return True
        except ConnectionRefusedError:
            continue
        except OSError:
            return True  # unresolvable or filtered: librdkafka gives the real answer
    return False


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    replication_factor: int = -1  # the broker's default


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec],
    *,
    extra: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> dict[str, str]:
    """Create the topics that do not exist yet. Returns ``{name: "created" | "exists"}``.

    An existing topic with fewer partitions than asked is an error (co-partitioning
    depends on it); more partitions are accepted as they are.

    Raises:
        ConfigurationError: an existing topic has fewer partitions than ``spec``.
        KafkaOperationError: the broker refused to create a topic.
    """
    client = admin(bootstrap, extra)
    specs = list(specs)
    metadata = client.list_topics(timeout=timeout).topics
    outcome: dict[str, str] = {}
    new = []
    for spec in specs:
        existing = metadata.get(spec.name)
        if existing is None or existing.error is not None:
            new.append(
                NewTopic(spec.name, spec.partitions, spec.replication_factor, config=dict(spec.config))
            )
            continue
        if len(existing.partitions) < spec.partitions:
            raise ConfigurationError(
                f"topic {spec.name} has {len(existing.partitions)} partitions, txbridge needs "
                f"{spec.partitions}: raise them with kafka-topics --alter, or set a matching --partitions"
            )
        outcome[spec.name] = "exists"
    if new:
        for name, future in client.create_topics(new, operation_timeout=timeout).items():
            try:
                future.result(timeout=timeout)
                outcome[name] = "created"
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    outcome[name] = "exists"
                else:
                    raise to_error(exc, f"creating topic {name}") from exc
        _await_listed(client, {t.topic: t.num_partitions for t in new}, timeout)
    return outcome


def _await_listed(client: AdminClient, partitions: Mapping[str, int], timeout: float) -> None:
    """Wait until a metadata listing shows each new topic with its partitions and their leaders.

    CreateTopics answers once the controller has created a topic; the broker that answers the
    next listing may not know it yet, and a producer started at once would say the topic does
    not exist (seen under load: a test's topic missing from the producer's first listing).
    """
    deadline = time.monotonic() + timeout
    waiting = dict(partitions)
    while waiting:
        listed = client.list_topics(timeout=max(0.1, deadline - time.monotonic())).topics
        for name, count in list(waiting.items()):
            topic = listed.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) >= count
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                del waiting[name]
        if not waiting:
            return
        if time.monotonic() >= deadline:
            logger.warning(
                "topics %s created but not listed with leaders after %.0fs", sorted(waiting), timeout
            )
            return
        time.sleep(0.05)


def delete_topics_with_prefix(
    bootstrap: str, prefix: str, *, extra: Mapping[str, Any] | None = None, timeout: float = 30.0
) -> list[str]:
    """Delete every topic whose name starts with ``prefix``. Returns the names deleted.

    Raises:
        ValueError: ``prefix`` is empty (that would delete every topic).
        KafkaOperationError: the broker refused to delete one of them.
    """
    if not prefix:
        raise ValueError("refusing to delete topics by an empty prefix")
    client = admin(bootstrap, extra)
    names = sorted(name for name in client.list_topics(timeout=timeout).topics if name.startswith(prefix))
    if not names:
        return []
    for name, future in client.delete_topics(names, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if not (exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise to_error(exc, f"deleting topic {name}") from exc
    return names


# ---------------------------------------------------------------- small helpers for assign/seek users

OFFSET_BEGINNING = -2
OFFSET_END = -1
#: Where to assign a partition to read it all: offset 0, not OFFSET_BEGINNING. librdkafka
#: resolves a logical offset with a ListOffsets round that took ~500 ms here (12 empty
#: partitions: 527 ms to their ends from OFFSET_BEGINNING, 12 ms from 0); a partition whose
#: start was deleted answers OFFSET_OUT_OF_RANGE and resets to its earliest offset
#: (``auto.offset.reset=earliest``, the default of :func:`consumer`).
FROM_START = 0
_TIMESTAMP_LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME


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


def append_time_ms(message: Any) -> int | None:
    """The broker's append time of a consumed record, or None when the topic keeps CreateTime."""
    kind, value = message.timestamp()
    return value if kind == _TIMESTAMP_LOG_APPEND_TIME else None


def is_partition_eof(error: Any) -> bool:
    return isinstance(error, KafkaError) and error.code() == KafkaError._PARTITION_EOF
