"""Least-privilege ACLs of txbridge's three roles: computed, rendered, applied (``txbridge acls``).

What each role's clients do on Kafka, read from the code (``tests/secure/test_acls.py``
runs the whole transaction path with exactly these ACLs and checks each denial):

producer (:class:`~txbridge.TransactionProducer`, its asyncio twin)
    One idempotent producer (no ``transactional.id``) writes half records to
    ``<ns>_half``, op records to ``<ns>_op`` and heartbeats to ``<ns>_producers``.
    Since Kafka 3.0 (KIP-679) an idempotent producer needs WRITE on a topic, not
    IdempotentWrite on the cluster. It lists the cluster's topics before a message's
    half record (a missing topic is refused up front), and a listing shows only the
    topics the principal may DESCRIBE: hence DESCRIBE on the real topics, WRITE when
    the service may also publish them directly. It reads nothing and joins no group.
    A producer *group* is txbridge's name for who answers back-checks: no Kafka
    resource carries it, so it has no ACL.

spark-sink (``txbridge.spark``: the driver program, its Spark Python workers and the tasks)
    What a producer does (each task and the driver's ``SinkChecks`` is a producer of the
    sink's group; the driver writes COMMIT / ROLLBACK op records), and the sink's own topic
    ``<ns>_spark_sink``: the tasks write journal entries to it, the driver decision records
    and tombstones, and both read it (``read_committed``; ``SinkChecks`` follows it). The
    sink creates that topic on first use (compacted, one partition): a LITERAL CREATE on
    that one name, which lets it create nothing else. Its readers assign partitions and
    commit nothing, under throwaway group ids ``txbridge-admin-*`` and
    ``txbridge-spark-checks-*`` (PREFIXED DESCRIBE, as the coordinator's helpers). The driver
    writes each decision record in a Kafka transaction whose ``transactional.id`` is
    ``<ns>-spark-sink-<sink key>`` (PREFIXED WRITE), which fences a zombie driver of the
    sink; it reads ``<ns>_expired`` for the batch's transactions that expired before their
    COMMIT and publishes them as ``txbridge admin resolve`` does (READ and WRITE on it, READ on
    ``<ns>_op``, the ``<ns>-admin-*`` fencing ids; before that it follows the positions in
    ``<ns>_state`` until they pass its COMMITs, READ on it; with ``--producers-may-not-write-real-topics``
    that publish is refused and the batch's write fails naming them).

coordinator (``txbridge coordinator``)
    Consumes ``<ns>_half`` and ``<ns>_op`` in its consumer group ``<group_id>``
    (default :func:`~txbridge.wire.default_coordinator_group`: ``txbridge-coordinator``,
    or ``txbridge-coordinator.<ns>`` for another namespace) and commits those offsets
    inside Kafka transactions with ``transactional.id`` ``<ns>-coord-<instance>-<random>``
    (a new one each time its clients are built, whatever the group: a PREFIXED ACL), and
    fences the ``<ns>-partition-<partition>`` ids an older txbridge committed under when it
    takes over a partition with no claim record (PREFIXED too). In them it
    publishes committed messages to the real topics and writes ``<ns>_op``,
    ``<ns>_state``, ``<ns>_expired`` and ``<ns>_quarantine``. It restores
    ``<ns>_state``, reads ``<ns>_producers`` (the registry) and ``<ns>_expired``.
    Helper clients that never commit use throwaway group ids with a random suffix,
    ``txbridge-registry-*``, ``txbridge-restore-*``, ``txbridge-halfreader-*`` and
    ``txbridge-admin-*`` (PREFIXED DESCRIBE: librdkafka looks up their group
    coordinator), and ``<group_id>-offsets`` reads end offsets. Re-checking expired
    transactions (``resume_expired``, on by default) decides them through admin
    resolve, whose fencing ``transactional.id`` is ``<ns>-admin-<tx id>`` (PREFIXED).

consumer (any read_committed consumer of the real topics; txbridge's own consumers)
    READ on the real topics and on its consumer group(s); nothing of the namespace's
    internal topics. txbridge's consumers (``txbridge consume``, ``OrderlyConsumer``,
    ``ConcurrentConsumer``) also create and use their group's dead-letter topic
    ``<ns>_dlq-<group>`` and the concurrent one its retry topic ``<ns>_retry-<group>``;
    ``plain_consumer=True`` leaves those two out for any other consumer.

Granting is additive: applying twice is harmless, and nothing is revoked.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from txbridge import kafka
from txbridge.errors import ConfigurationError, KafkaOperationError
from txbridge.kafka import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    KafkaException,
    ResourcePatternType,
    ResourceType,
)
from txbridge.wire import (
    DEFAULT_NAMESPACE,
    Topics,
    coordinator_transactional_prefix,
    default_coordinator_group,
    partition_transactional_id,
)

logger = logging.getLogger(__name__)


class Role(StrEnum):
    PRODUCER = "producer"
    SPARK_SINK = "spark-sink"
    COORDINATOR = "coordinator"
    CONSUMER = "consumer"


#: Resource types as ``kafka-acls.sh`` names them (its option is ``--<resource>``).
TOPIC = "topic"
GROUP = "group"
TRANSACTIONAL_ID = "transactional-id"

#: Throwaway group ids of the coordinator's helper clients (a random suffix follows).
COORDINATOR_HELPER_GROUPS = (
    "txbridge-registry-",
    "txbridge-restore-",
    "txbridge-halfreader-",
    "txbridge-admin-",
)
#: Throwaway group ids of the Spark sink's readers of ``<ns>_spark_sink`` (a random suffix follows).
SPARK_SINK_HELPER_GROUPS = ("txbridge-admin-", "txbridge-spark-checks-")

_PRINCIPAL = re.compile(r"^[A-Za-z][A-Za-z0-9]*:.+$")
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Acl:
    """One ALLOW binding: ``principal`` may do ``operation`` on a resource, from any host.

    Attributes:
        principal: ``User:name`` (Kafka's principal syntax).
        resource: ``topic``, ``group`` or ``transactional-id``.
        name: the resource name, or its prefix when ``prefixed``.
        prefixed: a PREFIXED pattern (every name starting with ``name``), else LITERAL.
        operation: ``Read``, ``Write``, ``Describe`` or ``Create`` (READ and WRITE imply DESCRIBE).
        why: what the role does with it, for the table.
    """

    principal: str
    resource: str
    name: str
    prefixed: bool
    operation: str
    why: str


def role_acls(
    role: Role | str,
    principal: str,
    *,
    topics: Sequence[str],
    namespace: str = DEFAULT_NAMESPACE,
    groups: Sequence[str] = (),
    producers_may_write_real_topics: bool = True,
    plain_consumer: bool = False,
) -> list[Acl]:
    """The ACLs ``principal`` needs to act as ``role``, and no more.

    Args:
        role: ``producer``, ``spark-sink``, ``coordinator`` or ``consumer``.
        principal: e.g. ``User:orders-svc``.
        topics: the real topics the transactions publish to; ``name*`` is every topic
            starting with ``name`` (a PREFIXED ACL).
        namespace: the prefix of txbridge's internal topics.
        groups: the coordinators' consumer group id (default: the namespace's,
            :func:`~txbridge.wire.default_coordinator_group`), or the consumer's group(s);
            a producer has none.
        producers_may_write_real_topics: False: a producer (or the Spark sink) may only
            DESCRIBE the real topics, so that only the coordinator publishes them.
        plain_consumer: leave out txbridge consumers' retry and dead-letter topics.

    Raises:
        ConfigurationError: a bad principal, topic or group, or an option of another role;
            the message says what to pass instead.
    """
    role = _role(role)
    if not _PRINCIPAL.match(principal):
        raise ConfigurationError(
            f"principal {principal!r} is not Type:name: pass e.g. --principal User:orders-svc"
        )
    if not namespace:
        raise ConfigurationError("namespace must not be empty")
    real = _real_topics(topics, Topics(namespace))
    if not producers_may_write_real_topics and role not in _PRODUCERS:
        raise ConfigurationError(
            "--producers-may-not-write-real-topics is an option of --role producer and spark-sink: "
            "the coordinator must write the real topics and a consumer writes none"
        )
    if plain_consumer and role is not Role.CONSUMER:
        raise ConfigurationError("--plain-consumer is an option of --role consumer")
    if any(not g or not g.strip() for g in groups):
        raise ConfigurationError("a --group must not be empty")
    if role in _PRODUCERS:
        if groups:
            raise ConfigurationError(
                "a producer joins no Kafka group: its producer group names who answers back-checks "
                "and needs no ACL; drop --group"
            )
        acls = _producer(principal, namespace, real, producers_may_write_real_topics)
        return acls + _spark_sink(principal, namespace) if role is Role.SPARK_SINK else acls
    if role is Role.COORDINATOR:
        coordinators = list(groups) or [default_coordinator_group(namespace)]
        return _coordinator(principal, namespace, real, coordinators)
    if not groups:
        raise ConfigurationError("a consumer reads in a consumer group: pass --group NAME (repeatable)")
    return _consumer(principal, namespace, real, list(groups), plain_consumer)


_PRODUCERS = (Role.PRODUCER, Role.SPARK_SINK)


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise ConfigurationError(f"unknown role {role!r}: one of {known}") from None


def _real_topics(topics: Sequence[str], names: Topics) -> list[tuple[str, bool]]:
    """``(name, prefixed)`` per real topic; refuses a name or prefix that covers an internal topic."""
    if not topics:
        raise ConfigurationError(
            "name the real topics the transactions publish to: --topic NAME (repeatable; NAME* for a prefix)"
        )
    internal = [
        names.half,
        names.op,
        names.state,
        names.producers,
        names.expired,
        names.quarantine,
        names.spark_sink,
    ]
    out: list[tuple[str, bool]] = []
    for topic in topics:
        prefixed = topic.endswith("*")
        name = topic[:-1] if prefixed else topic
        if not _TOPIC_NAME.match(name):
            raise ConfigurationError(
                f"--topic {topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; "
                "a trailing '*' for a prefix)"
            )
        covered = [t for t in internal if (t.startswith(name) if prefixed else t == name)]
        if covered:
            raise ConfigurationError(
                f"--topic {topic!r} covers txbridge's internal topic {covered[0]}: "
                "name the real topics, or a prefix that no internal topic starts with"
            )
        out.append((name, prefixed))
    return out


def _producer(principal: str, namespace: str, real: list[tuple[str, bool]], may_write: bool) -> list[Acl]:
    names = Topics(namespace)
    acls = [
        Acl(principal, TOPIC, names.half, False, "Write", "half records (idempotent producer)"),
        Acl(principal, TOPIC, names.op, False, "Write", "COMMIT / ROLLBACK op records"),
        Acl(principal, TOPIC, names.producers, False, "Write", "heartbeats: this instance and its check URL"),
    ]
    for name, prefixed in real:
        if may_write:
            acls.append(Acl(principal, TOPIC, name, prefixed, "Write", "may also publish it directly"))
        else:
            acls.append(
                Acl(
                    principal,
                    TOPIC,
                    name,
                    prefixed,
                    "Describe",
                    "sees it exists; only the coordinator writes it",
                )
            )
    return acls


def _spark_sink(principal: str, namespace: str) -> list[Acl]:
    topic = Topics(namespace).spark_sink
    acls = [
        Acl(principal, TOPIC, topic, False, "Create", "created on first use (compacted, one partition)"),
        Acl(principal, TOPIC, topic, False, "Read", "the driver reads the decisions and journal of a batch"),
        Acl(principal, TOPIC, topic, False, "Write", "tasks' journal entries; the driver's decision records"),
    ]
    acls += [
        Acl(principal, GROUP, prefix, True, "Describe", "readers' throwaway groups (random suffix)")
        for prefix in SPARK_SINK_HELPER_GROUPS
    ]
    names = Topics(namespace)
    acls += [
        Acl(
            principal,
            TRANSACTIONAL_ID,
            f"{namespace}-spark-sink-",
            True,
            "Write",
            "one driver decides a batch",
        ),
        Acl(principal, TOPIC, names.expired, False, "Read", "a decided batch's transactions that expired"),
        Acl(principal, TOPIC, names.expired, False, "Write", "their resolve markers (published once)"),
        Acl(principal, TOPIC, names.op, False, "Read", "resolve looks for an earlier admin decision"),
        Acl(
            principal,
            TOPIC,
            names.state,
            False,
            "Read",
            "waits for the coordinators' positions to pass its COMMITs",
        ),
    ]
    acls += [
        Acl(
            principal,
            TRANSACTIONAL_ID,
            prefix,
            True,
            "Write",
            "resolving expired ones: admin resolve's fencing id",
        )
        for prefix in _admin_fence_prefixes(namespace)
    ]
    return acls


def _coordinator(
    principal: str, namespace: str, real: list[tuple[str, bool]], groups: list[str]
) -> list[Acl]:
    names = Topics(namespace)
    p = principal
    acls = [
        Acl(p, TOPIC, names.half, False, "Read", "consumes half records; re-reads evicted payloads"),
        Acl(p, TOPIC, names.op, False, "Read", "consumes op records"),
        Acl(p, TOPIC, names.op, False, "Write", "its back-checks' decisions; resumed expired ones"),
        Acl(p, TOPIC, names.state, False, "Read", "restores pending transactions on assignment"),
        Acl(p, TOPIC, names.state, False, "Write", "changelog of pending transactions"),
        Acl(p, TOPIC, names.producers, False, "Read", "the producer registry: who is live, where to check"),
        Acl(p, TOPIC, names.expired, False, "Read", "expired transactions, re-checked when a group returns"),
        Acl(p, TOPIC, names.expired, False, "Write", "copies of expired transactions; resolve markers"),
        Acl(p, TOPIC, names.quarantine, False, "Write", "committed messages it could not publish"),
    ]
    acls += [
        Acl(p, TOPIC, name, prefixed, "Write", "publishes committed messages") for name, prefixed in real
    ]
    for group in groups:
        acls += [
            Acl(p, GROUP, group, False, "Read", "the coordinators' group over half and op"),
            Acl(p, GROUP, f"{group}-offsets", False, "Describe", "a client that reads end offsets"),
        ]
    acls += [
        Acl(
            p,
            TRANSACTIONAL_ID,
            coordinator_transactional_prefix(namespace),
            True,
            "Write",
            "each coordinator incarnation's transactional.id, whatever the group; fencing an earlier one",
        ),
        Acl(
            p,
            TRANSACTIONAL_ID,
            partition_transactional_id(namespace, 0)[:-1],
            True,
            "Write",
            "fencing the per-partition ids an older txbridge committed under (the upgrade)",
        ),
    ]
    acls += [
        Acl(p, GROUP, prefix, True, "Describe", "helper clients' throwaway groups (random suffix)")
        for prefix in COORDINATOR_HELPER_GROUPS
    ]
    acls += [
        Acl(p, TRANSACTIONAL_ID, prefix, True, "Write", "resuming expired ones: admin resolve's fencing id")
        for prefix in _admin_fence_prefixes(namespace)
    ]
    return acls


def _admin_fence_prefixes(namespace: str) -> list[str]:
    """Prefixes of :func:`txbridge.admin._once.fence_id` (it hashes long ids behind ``namespace[:100]``)."""
    prefixes = [f"{namespace}-admin-"]
    if len(namespace) > 100:
        prefixes.append(f"{namespace[:100]}-admin-sha256-")
    return prefixes


def _consumer(
    principal: str, namespace: str, real: list[tuple[str, bool]], groups: list[str], plain: bool
) -> list[Acl]:
    names = Topics(namespace)
    acls = [
        Acl(principal, TOPIC, name, prefixed, "Read", "reads committed messages") for name, prefixed in real
    ]
    for group in groups:
        acls.append(Acl(principal, GROUP, group, False, "Read", "its consumer group"))
        if plain:
            continue
        dlq, retry = names.dead_letter(group), names.retry(group)
        acls += [
            Acl(principal, TOPIC, dlq, False, "Create", "txbridge consumers create their dead-letter topic"),
            Acl(principal, TOPIC, dlq, False, "Write", "messages past their last retry"),
            Acl(principal, TOPIC, retry, False, "Create", "the concurrent consumer creates its retry topic"),
            Acl(principal, TOPIC, retry, False, "Read", "failed messages come back from it"),
            Acl(principal, TOPIC, retry, False, "Write", "failed messages wait in it"),
        ]
    return acls


# ---------------------------------------------------------------- rendering


def _merged(acls: Iterable[Acl]) -> list[tuple[str, str, str, bool, list[str], list[str]]]:
    """``(principal, resource, name, prefixed, operations, whys)`` per resource, in first-seen order."""
    out: dict[tuple[str, str, str, bool], tuple[list[str], list[str]]] = {}
    for acl in acls:
        ops, whys = out.setdefault((acl.principal, acl.resource, acl.name, acl.prefixed), ([], []))
        if acl.operation not in ops:
            ops.append(acl.operation)
        if acl.why not in whys:
            whys.append(acl.why)
    return [(p, r, n, pre, ops, whys) for (p, r, n, pre), (ops, whys) in out.items()]


def render_table(acls: Sequence[Acl]) -> str:
    """One line per resource: type, pattern, name, operations, and why the role needs them."""
    rows = [("resource", "pattern", "name", "operations", "why")]
    for _principal, resource, name, prefixed, ops, whys in _merged(acls):
        shown = f"{name}*" if prefixed else name
        rows.append((resource, "prefixed" if prefixed else "literal", shown, ",".join(ops), "; ".join(whys)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def render_commands(
    acls: Sequence[Acl], bootstrap: str | None = None, command_config: str | None = None
) -> str:
    """The same ACLs as ``kafka-acls.sh --add`` command lines (one per resource)."""
    head = ["kafka-acls.sh", "--bootstrap-server", bootstrap or "$BOOTSTRAP"]
    if command_config:
        head += ["--command-config", command_config]
    lines = []
    for principal, resource, name, prefixed, ops, _whys in _merged(acls):
        args = [*head, "--add", "--allow-principal", principal]
        for op in ops:
            args += ["--operation", op]
        args += [f"--{resource}", name]
        if prefixed:
            args += ["--resource-pattern-type", "prefixed"]
        lines.append(" ".join(a if a == "$BOOTSTRAP" else shlex.quote(a) for a in args))
    return "\n".join(lines)


# ---------------------------------------------------------------- applying

_RESOURCE_TYPES = {
    TOPIC: ResourceType.TOPIC,
    GROUP: ResourceType.GROUP,
    TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
}


def apply_acls(bootstrap: str, acls: Sequence[Acl], extra: Mapping[str, Any] | None = None) -> int:
    """Create ``acls`` through the admin API (existing ones are left as they are). Returns how many.

    The client's principal needs ALTER on the cluster (a super user, say).

    Raises:
        KafkaOperationError: the broker refused one (the message names it); others may be created.
    """
    if not acls:
        return 0
    wanted = {_binding(acl): acl for acl in acls}
    client = kafka.admin(bootstrap, extra)
    for binding, future in client.create_acls(list(wanted), request_timeout=30).items():
        try:
            future.result(timeout=60)
        except KafkaException as exc:
            error = kafka.to_error(exc, f"creating the ACL {describe(wanted[binding])}")
            if "AUTHORIZATION_FAILED" in str(error):
                raise KafkaOperationError(
                    f"{error}: apply ACLs as a principal allowed to alter the cluster's ACLs "
                    "(a super user): pass its --command-config"
                ) from exc
            raise error from exc
    logger.info("created %d ACLs for %s", len(wanted), ", ".join(sorted({a.principal for a in acls})))
    return len(wanted)


def _binding(acl: Acl) -> AclBinding:
    return AclBinding(
        _RESOURCE_TYPES[acl.resource],
        acl.name,
        ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
        acl.principal,
        "*",
        AclOperation[acl.operation.upper()],
        AclPermissionType.ALLOW,
    )


def describe(acl: Acl) -> str:
    """``User:x may Read topic t`` (``prefixed topic t*`` for a prefix)."""
    pattern = f"prefixed {acl.resource} {acl.name}*" if acl.prefixed else f"{acl.resource} {acl.name}"
    return f"{acl.principal} may {acl.operation} {pattern}"
