"""Admin calls: topics, reachability, and the admin types of confluent_kafka the tools use.

:func:`admin` makes an ``AdminClient`` with txbridge's settings; :func:`ensure_topics` and
:func:`delete_topics_with_prefix` manage topics; :func:`check_reachable` probes the brokers
before a command starts and says what to change when they do not answer. ``AdminClient``,
``NewTopic``, ``ElectionType`` and the ACL types (``AclBinding``, ``AclOperation``,
``AclPermissionType``, ``ResourcePatternType``, ``ResourceType``) are confluent_kafka's own
classes, re-exported.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    ConsumerGroupState,
    ElectionType,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)

from txbridge.errors import ConfigurationError, KafkaOperationError, KafkaUnavailableError, TxBridgeError
from txbridge.kafka.config import Config, client_config
from txbridge.kafka.errors import to_error
from txbridge.kafka.secrets import MASK, is_secret

__all__ = [
    "AclBinding",
    "AclOperation",
    "AclPermissionType",
    "AdminClient",
    "ElectionType",
    "NewTopic",
    "ResourcePatternType",
    "ResourceType",
    "TopicSpec",
    "admin",
    "broker_count",
    "check_reachable",
    "delete_topics_with_prefix",
    "ensure_topics",
    "groups_consuming",
    "offset_bounds",
    "stable_offsets",
]

logger = logging.getLogger(__name__)


def admin(bootstrap: str, extra: Mapping[str, Any] | None = None) -> AdminClient:
    return AdminClient(client_config(bootstrap, extra))


def broker_count(bootstrap: str, extra: Mapping[str, Any] | None = None, *, timeout: float = 10.0) -> int:
    """How many brokers the cluster's metadata lists.

    Raises:
        KafkaException: no broker answered within ``timeout``.
    """
    return len(admin(bootstrap, extra).list_topics(timeout=timeout).brokers)


def partition_counts(
    bootstrap: str, topics: Iterable[str], *, extra: Mapping[str, Any] | None = None, timeout: float = 10.0
) -> dict[str, int | None]:
    """How many partitions each of ``topics`` has (None for a topic that does not exist).

    Raises:
        KafkaOperationError: no broker answered within ``timeout``.
    """
    try:
        metadata = admin(bootstrap, extra).list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise to_error(exc, "listing topics") from exc
    counts: dict[str, int | None] = {}
    for name in topics:
        found = metadata.get(name)
        counts[name] = None if found is None or found.error is not None else len(found.partitions)
    return counts


def group_protocols(
    bootstrap: str, extra: Mapping[str, Any] | None = None, *, timeout: float = 10.0
) -> set[str] | None:
    """The group protocols the cluster's group coordinators accept (``classic``, ``consumer``),
    from a broker's ``group.coordinator.rebalance.protocols``; an empty set when the broker has
    no such setting (before Kafka 3.7: classic only); None when its settings cannot be read
    (no broker answered, or this principal may not describe them)."""
    client = admin(bootstrap, extra)
    try:
        brokers = sorted(client.list_topics(timeout=timeout).brokers)
        resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
        entries = client.describe_configs([resource])[resource].result(timeout=timeout)
    except (KafkaException, IndexError) as exc:
        logger.info("reading the brokers' group protocols: %s", exc)
        return None
    entry = entries.get("group.coordinator.rebalance.protocols")
    if entry is None or entry.value is None:
        return set()
    return {item.strip() for item in str(entry.value).split(",") if item.strip()}


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
        created = {t.topic: t.num_partitions for t in new}
        deadline = time.monotonic() + timeout
        _await_listed(client, created, timeout)
        _await_serving(client, created, deadline)
    return outcome


def lower_topic_setting(
    bootstrap: str,
    topics: Iterable[str],
    name: str,
    value: int,
    *,
    extra: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
) -> list[str]:
    """Set the numeric topic setting ``name`` to ``value`` where it is larger; returns those topics.

    Topics of ``topics`` that do not exist are left out. The setting is changed alone
    (incremental alter), the topics' other settings stay.

    Raises:
        KafkaOperationError: the broker refused to describe or change a topic's settings.
    """
    topics = list(topics)
    client = admin(bootstrap, extra)
    existing = set(client.list_topics(timeout=timeout).topics)
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics if topic in existing]
    try:
        described = client.describe_configs(resources) if resources else {}
        larger = [
            r.name
            for r, future in described.items()
            if int(future.result(timeout=timeout)[name].value) > value
        ]
        entry = [ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)]
        changes = [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entry) for topic in larger]
        for future in client.incremental_alter_configs(changes).values() if changes else ():
            future.result(timeout=timeout)
    except KafkaException as exc:
        raise to_error(exc, f"lowering {name} of {', '.join(topics)}") from exc
    return larger


def set_cluster_setting(
    bootstrap: str,
    name: str,
    value: str | None,
    *,
    extra: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> None:
    """Set the dynamic setting ``name`` to ``value`` on every broker of the cluster (None:
    delete it, back to each broker's static one).

    Per broker, not as the cluster-wide default: librdkafka sends no broker resource without a
    broker id.

    Raises:
        KafkaOperationError: the brokers refused the change.
    """
    op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
    entry = ConfigEntry(name, value, incremental_operation=op)
    client = admin(bootstrap, extra)
    try:
        brokers = client.list_topics(timeout=timeout).brokers
        resources = [
            ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=[entry])
            for broker in brokers
        ]
        for future in client.incremental_alter_configs(resources).values():
            future.result(timeout=timeout)
    except KafkaException as exc:
        raise to_error(exc, f"setting the brokers' {name}") from exc


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


#: What a partition's leader answers before it has taken the leadership the metadata already names.
_NOT_SERVING_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


def _await_serving(client: AdminClient, partitions: Mapping[str, int], deadline: float) -> None:
    """Wait until each new partition's leader answers a ListOffsets request.

    The metadata names a leader before that broker has become it: a ListOffsets or a fetch
    sent then is answered NOT_LEADER_FOR_PARTITION, and clients that do not retry it fail
    (seen under load: ``txbridge admin resolve`` right after ``txbridge init``). So the
    topics are ready when this returns, for every client; nobody has to retry.
    """
    waiting = {TopicPartition(t, p): OffsetSpec.latest() for t, n in partitions.items() for p in range(n)}
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            names = sorted({tp.topic for tp in waiting})
            logger.warning("topics %s created but %d partition(s) not serving yet", names, len(waiting))
            return
        futures = client.list_offsets(dict(waiting), request_timeout=max(1.0, min(remaining, 10.0)))
        for tp, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args and exc.args[0].code() in _NOT_SERVING_YET:
                    continue
                # Not a leader still starting (a principal that may create but not describe,
                # say): not this wait's to report; the topic's first real user will.
                logger.debug("not waiting for %s/%d to serve: %s", tp.topic, tp.partition, exc)
            waiting.pop(tp, None)
        if waiting:
            time.sleep(0.05)


def stable_offsets(client: AdminClient, topic: str, *, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """``{partition: (last stable offset, high watermark)}`` of ``topic``'s partitions.

    The last stable offset is where a read_committed reader stops: it stays behind the high
    watermark while a transaction that wrote to the partition is open.

    Raises:
        KafkaOperationError: the topic is not there, or a partition's offsets did not come.
    """
    listed = client.list_topics(topic, timeout=timeout).topics.get(topic)
    if listed is None or listed.error is not None:
        raise KafkaOperationError(f"listing {topic}: {listed.error if listed else 'no such topic'}")
    bounds = offset_bounds(client, topic, list(listed.partitions), timeout=timeout)
    return {p: (stable, high) for p, (_low, stable, high) in bounds.items()}


def offset_bounds(
    client: AdminClient, topic: str, partitions: Iterable[int], *, timeout: float = 5.0
) -> dict[int, tuple[int, int, int]]:
    """``{partition: (log start offset, last stable offset, high watermark)}`` of ``partitions``
    of ``topic``: one request per bound for all of them, where a consumer's
    ``get_watermark_offsets`` is a round trip per partition and per bound (a take-over of 12
    partitions spent 0.15 s so).

    Raises:
        KafkaOperationError: a partition's offsets did not come (within ``timeout``: retriable).
    """
    wanted = list(partitions)
    out: dict[int, list[int]] = {p: [0, 0, 0] for p in wanted}
    asked = (
        (OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED),
        (OffsetSpec.latest(), IsolationLevel.READ_COMMITTED),
        (OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED),
    )
    # Asked together, answered together: the three requests' round trips overlap.
    pending = [
        client.list_offsets(
            {TopicPartition(topic, p): spec for p in wanted}, isolation_level=level, request_timeout=timeout
        )
        for spec, level in asked
    ]
    for index, futures in enumerate(pending):
        for tp, future in futures.items():
            try:
                out[tp.partition][index] = future.result(timeout=timeout).offset
            except KafkaException as exc:
                raise to_error(exc, f"the offsets of {topic}/{tp.partition}") from exc
            except TimeoutError as exc:  # the future's own wait: a broker gone, say; asked again
                raise KafkaOperationError(
                    f"the offsets of {topic}/{tp.partition}: no answer within {timeout:g}s", retriable=True
                ) from exc
    return {p: (low, stable, high) for p, (low, stable, high) in out.items()}


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


_MEMBERLESS = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD})


def groups_consuming(
    bootstrap: str, topics: Iterable[str], *, extra: Mapping[str, Any] | None = None, timeout: float = 10.0
) -> dict[str, list[str]]:
    """Consumer groups with a live member assigned a partition of any of ``topics``: group id ->
    the client ids of those members. Only groups this principal may describe are seen.

    Raises:
        KafkaOperationError: the groups could not be listed.
    """
    wanted = set(topics)
    client = admin(bootstrap, extra)
    try:
        listed = client.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
    except KafkaException as exc:
        raise to_error(exc, "listing consumer groups") from exc
    # Only groups that may have members are described: a cluster keeps every group that ever
    # committed an offset, and describing each is a round trip per group at every coordinator
    # start. A state the client does not name (a KIP-848 group assigning or reconciling) is
    # UNKNOWN here and described.
    ids = [g.group_id for g in listed.valid if g.state not in _MEMBERLESS]
    if not ids:
        return {}
    found: dict[str, list[str]] = {}
    for group_id, future in client.describe_consumer_groups(ids, request_timeout=timeout).items():
        try:
            description = future.result(timeout=timeout)
        except KafkaException as exc:  # gone meanwhile, or not ours to describe: not serving then
            logger.debug("describing group %s: %s", group_id, exc)
            continue
        members = [
            m.client_id
            for m in description.members
            if m.assignment is not None and any(tp.topic in wanted for tp in m.assignment.topic_partitions)
        ]
        if members:
            found[group_id] = sorted(members)
    return found
