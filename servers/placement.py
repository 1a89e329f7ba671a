"""Where a Kafka cluster puts things, and waiting for it to heal after a node comes back.

For fault injection on a replicated cluster (:class:`servers.cluster.LocalCluster`,
``txbridge bench``'s nodekill step): which node leads a partition, which node is the
transaction coordinator of a transactional id or the group coordinator of a group (the leader of
its ``__transaction_state`` / ``__consumer_offsets`` partition), topics created with one node as
every partition's preferred leader, and the waits for replicas to be in sync and leaders back
on their preferred replicas. Everything goes through an admin client, so it works on any cluster.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from txbridge import kafka
from txbridge.errors import BrokerError
from txbridge.kafka import AdminClient, ElectionType, KafkaError, KafkaException, NewTopic, TopicPartition

logger = logging.getLogger(__name__)

TRANSACTION_LOG = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: 31-based over UTF-16 code units, as a signed 32-bit int."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(name: str, partitions: int) -> int:
    """The internal-topic partition of a transactional id or a group: ``Utils.abs(hashCode) % n``.

    Kafka's ``TransactionStateManager.partitionFor`` and ``GroupMetadataManager.partitionFor``;
    ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0.
    """
    h = java_string_hash(name)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    """``{partition: the node leading it}`` (-1: no leader) of ``topic``."""
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {number: int(meta.leader) for number, meta in partitions.items()}


def coordinator_node(admin: AdminClient, internal_topic: str, name: str) -> int:
    """The node coordinating ``name`` (a transactional id in :data:`TRANSACTION_LOG`, a group in
    :data:`OFFSETS_TOPIC`): the leader of its partition there."""
    log = leaders(admin, internal_topic)
    return log[partition_for(name, len(log))]


def transaction_coordinators(admin: AdminClient, ids: Iterable[str]) -> Counter[int]:
    """How many of the transactional ``ids`` each node is the transaction coordinator of."""
    log = leaders(admin, TRANSACTION_LOG)
    return Counter(log[partition_for(i, len(log))] for i in ids)


def ensure_internal_topics(bootstrap: str, extra: Mapping[str, Any] | None, timeout: float = 60.0) -> None:
    """Have the cluster create :data:`TRANSACTION_LOG` and :data:`OFFSETS_TOPIC`, which it does at
    the first transactional producer's ``InitProducerId`` and the first group's ``FindCoordinator``,
    so that their leaders can be read before any real client starts.

    Raises:
        BrokerError: they were not there, with leaders, within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    warm = f"txbridge-warm-{time.time_ns()}"
    producer = kafka.producer(bootstrap, extra, transactional_id=warm)
    kafka.init_transactions(producer, timeout)
    producer.flush(0)
    consumer = kafka.consumer(bootstrap, warm, extra)
    try:
        while True:
            try:
                consumer.committed([TopicPartition(TRANSACTION_LOG, 0)], timeout=5.0)
                break
            except KafkaException as exc:  # the coordinator is not available while the topic is created
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"{OFFSETS_TOPIC} was not created within {timeout:.0f}s: {exc}"
                    ) from exc
                time.sleep(0.5)
    finally:
        consumer.close()
    admin = kafka.admin(bootstrap, extra)
    while not all(_led(admin, topic) for topic in (TRANSACTION_LOG, OFFSETS_TOPIC)):
        if time.monotonic() > deadline:
            raise BrokerError(f"{TRANSACTION_LOG} and {OFFSETS_TOPIC} have no leaders after {timeout:.0f}s")
        time.sleep(0.5)


def _led(admin: AdminClient, topic: str) -> bool:
    """Whether ``topic`` exists and each of its partitions has a leader."""
    led = leaders(admin, topic)
    return bool(led) and min(led.values()) >= 0


def led_by(leader: int, node_ids: Sequence[int], partitions: int) -> list[list[int]]:
    """A replica assignment with ``leader`` the preferred leader (first replica) of every
    partition, the other nodes following in turns."""
    others = [n for n in node_ids if n != leader]
    return [[leader, *others[p % len(others) :], *others[: p % len(others)]] for p in range(partitions)]


def round_robin(node_ids: Sequence[int], partitions: int) -> list[list[int]]:
    """A replica assignment whose preferred leaders go round the nodes (every node leads as many)."""
    n = len(node_ids)
    return [[node_ids[(p + k) % n] for k in range(n)] for p in range(partitions)]


def create_topics(
    bootstrap: str,
    specs: Iterable[kafka.TopicSpec],
    assignments: Mapping[str, list[list[int]]],
    *,
    extra: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``specs``, those named in ``assignments`` with that replica assignment, the others
    with the cluster's defaults; an existing topic is left as it is.

    Raises:
        KafkaOperationError: the cluster refused to create one.
    """
    specs = list(specs)
    placed = [
        NewTopic(
            s.name, len(assignments[s.name]), replica_assignment=assignments[s.name], config=dict(s.config)
        )
        for s in specs
        if s.name in assignments
    ]
    if placed:
        client = kafka.admin(bootstrap, extra)
        for name, future in client.create_topics(placed, operation_timeout=timeout).items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise kafka.to_error(exc, f"creating topic {name}") from exc
    # The others, and a listing of every topic with its leaders before anything produces.
    kafka.ensure_topics(bootstrap, specs, extra=extra, timeout=timeout)


def out_of_sync(admin: AdminClient, topics: Iterable[str] | None = None) -> list[str]:
    """The partitions of ``topics`` (default: every topic) with a replica out of sync, or no leader."""
    metadata = admin.list_topics(timeout=10).topics
    names = sorted(metadata) if topics is None else list(topics)
    return [
        f"{topic}/{number}"
        for topic in names
        for number, meta in metadata[topic].partitions.items()
        if len(meta.isrs) < len(meta.replicas) or meta.leader < 0
    ]


def wait_in_sync(admin: AdminClient, topics: Iterable[str] | None = None, *, timeout: float) -> float:
    """Wait until every replica of ``topics`` (default: every topic) is in sync; returns how long
    it took.

    Raises:
        BrokerError: some were still out of sync after ``timeout``.
    """
    started = time.monotonic()
    names = None if topics is None else list(topics)
    while behind := _behind(admin, names):
        if time.monotonic() - started > timeout:
            raise BrokerError(f"replicas not in sync within {timeout:.0f}s: {behind[:10]}")
        time.sleep(0.5)
    return time.monotonic() - started


def _behind(admin: AdminClient, topics: list[str] | None) -> list[str]:
    try:
        return out_of_sync(admin, topics)
    except KafkaException as exc:  # no metadata now (a node just came back): not in sync yet
        return [f"(no metadata: {exc})"]


def not_on_preferred(admin: AdminClient) -> list[str]:
    """The partitions (of every topic) led by another node than their preferred (first) replica."""
    metadata = admin.list_topics(timeout=10).topics
    return [
        f"{topic}/{number}"
        for topic, meta in sorted(metadata.items())
        for number, part in meta.partitions.items()
        if part.replicas and part.leader != part.replicas[0]
    ]


def elect_preferred_leaders(admin: AdminClient, *, timeout: float = 60.0) -> list[str]:
    """Move every partition's leadership back to its preferred replica, as Kafka's automatic
    rebalance does only every ``leader.imbalance.check.interval.seconds`` (5 minutes): a node
    that came back leads nothing until then. A replica not in sync cannot lead: the election is
    asked again until it is. Returns the partitions still elsewhere after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            # Per partition: None, or why not ("election not needed"...): the listing tells.
            # No timeout arguments: confluent-kafka 2.16 raises SystemError on any keyword here.
            admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout)
        except KafkaException as exc:
            logger.info("preferred leader election refused (%s); asking again", exc)
        asked = time.monotonic()
        while (elsewhere := not_on_preferred(admin)) and time.monotonic() - asked < 2.0:
            time.sleep(0.2)
        if not elsewhere or time.monotonic() > deadline:
            return elsewhere
