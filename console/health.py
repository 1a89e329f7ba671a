"""A namespace's health as Kafka shows it: its coordinators, who owns which partition, the lag of
half and op, and how old the oldest pending transaction is.

Everything here comes from the cluster, not from the coordinators: the coordinators' consumer
group (its members and their assignments), the copy of their positions that they commit to the
group for monitoring, the high watermarks, and the pending entries of ``<ns>_state``. So the
page answers while coordinators are down, which is when it is needed. :func:`assemble` is the
pure part, tested without a broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from txbridge import kafka
from txbridge.admin import list_positions
from txbridge.errors import TxBridgeError
from txbridge.wire import Topics

__all__ = ["CoordinatorView", "Member", "NamespaceHealth", "PartitionView", "assemble", "read_health"]

_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Member:
    """One member of the coordinators' group, as the group coordinator describes it."""

    name: str  # its group.instance.id (static membership), else its client.id
    host: str
    half: tuple[int, ...]  # half partitions assigned to it
    holds_other: bool = False  # it holds partitions of other topics only (a static member handing over)


@dataclass(frozen=True)
class PartitionView:
    """One partition (half p, op p, state p) of a namespace."""

    partition: int
    owner: str | None
    half_lag: int | None  # None: the group committed no position for it
    op_lag: int | None
    pending: int = 0
    oldest_pending_ms: int | None = None  # the first half's append time of its oldest pending transaction


@dataclass(frozen=True)
class CoordinatorView:
    name: str
    host: str
    partitions: tuple[int, ...]
    ready: bool
    why: str  # what readiness rests on, or why not
    half_lag: int | None
    op_lag: int | None


@dataclass
class NamespaceHealth:
    namespace: str
    group: str
    group_state: str
    coordinators: list[CoordinatorView] = field(default_factory=list)
    partitions: list[PartitionView] = field(default_factory=list)
    unserved: list[int] = field(default_factory=list)
    pending: int = 0
    oldest_pending_ms: int | None = None
    error: str = ""  # what could not be read (the rest is shown)

    def oldest_age_s(self, now_ms: int) -> float | None:
        return None if self.oldest_pending_ms is None else max(0.0, (now_ms - self.oldest_pending_ms) / 1000)


def _lag(end: int | None, committed: int | None) -> int | None:
    if end is None or committed is None or committed < 0:
        return None
    return max(0, end - committed)


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def assemble(
    namespace: str,
    *,
    group: str,
    group_state: str,
    partitions: int,
    members: Sequence[Member],
    ends: Mapping[tuple[str, int], int],
    committed: Mapping[tuple[str, int], int],
    pending: Sequence[Mapping[str, Any]],
) -> NamespaceHealth:
    """The health of one namespace from what was read.

    Args:
        group_state: the group's state as the broker names it (``stable``, ``preparing_rebalance``, ...).
        partitions: how many half partitions the namespace has.
        members: the group's members.
        ends: ``{(topic, partition): high watermark}`` of half and op.
        committed: ``{(topic, partition): offset}`` of half and op the coordinators have reached:
            the later of their positions records and their group's committed offsets (a copy).
        pending: :func:`txbridge.admin.list_pending`'s entries (``p`` the partition, ``first`` the
            first half's append time in ms).
    """
    topics = Topics(namespace)
    owner = {p: m.name for m in members for p in m.half}
    per_partition: dict[int, list[int | None]] = {p: [] for p in range(partitions)}
    for entry in pending:
        p = entry.get("p")
        if isinstance(p, int) and p in per_partition:
            first = entry.get("first")
            per_partition[p].append(first if isinstance(first, int) else None)
    views = []
    for p in range(partitions):
        firsts = [f for f in per_partition[p] if f is not None]
        views.append(
            PartitionView(
                partition=p,
                owner=owner.get(p),
                half_lag=_lag(ends.get((topics.half, p)), committed.get((topics.half, p))),
                op_lag=_lag(ends.get((topics.op, p)), committed.get((topics.op, p))),
                pending=len(per_partition[p]),
                oldest_pending_ms=min(firsts) if firsts else None,
            )
        )
    unserved = [v.partition for v in views if v.owner is None]
    stable = group_state == "stable"
    coordinators = []
    for m in sorted(members, key=lambda m: m.name):
        if not stable:
            ready, why = False, f"the group is {group_state.replace('_', ' ')}"
        elif m.half:
            ready, why = True, f"owns {len(m.half)} partition(s)"
        elif m.holds_other:
            ready, why = False, "handing over: holds no half partition (a stopped static member)"
        elif unserved:
            ready, why = False, f"owns nothing while partitions {unserved} are unserved"
        else:
            ready, why = True, "standby: every partition is served by another member"
        mine = [views[p] for p in m.half if p < len(views)]
        coordinators.append(
            CoordinatorView(
                name=m.name,
                host=m.host,
                partitions=tuple(sorted(m.half)),
                ready=ready,
                why=why,
                half_lag=_sum(v.half_lag for v in mine),
                op_lag=_sum(v.op_lag for v in mine),
            )
        )
    oldest = [v.oldest_pending_ms for v in views if v.oldest_pending_ms is not None]
    return NamespaceHealth(
        namespace=namespace,
        group=group,
        group_state=group_state,
        coordinators=coordinators,
        partitions=views,
        unserved=unserved,
        pending=sum(v.pending for v in views),
        oldest_pending_ms=min(oldest) if oldest else None,
    )


def _state_name(state: Any) -> str:
    name = getattr(state, "name", None) or str(state)
    return name.rsplit(".", 1)[-1].lower()


def read_members(
    bootstrap: str, group: str, half_topic: str, extra: Mapping[str, Any] | None
) -> tuple[str, list[Member]]:
    """The group's state and members.

    Raises:
        KafkaOperationError: the group could not be described.
    """
    client = kafka.admin(bootstrap, extra)
    try:
        described = client.describe_consumer_groups([group], request_timeout=_TIMEOUT_S)[group].result(
            _TIMEOUT_S
        )
    except Exception as exc:
        raise kafka.to_error(exc, f"describing the coordinators' group {group}") from exc
    members = []
    for m in described.members:
        held = list(m.assignment.topic_partitions) if m.assignment else []
        half = tuple(sorted(tp.partition for tp in held if tp.topic == half_topic))
        members.append(
            Member(
                name=m.group_instance_id or m.client_id,
                host=(m.host or "").lstrip("/"),
                half=half,
                holds_other=not half and bool(held),
            )
        )
    return _state_name(described.state), members


def read_offsets(
    bootstrap: str, group: str, topics: Topics, partitions: int, extra: Mapping[str, Any] | None
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """``(ends, reached)`` of half and op: the high watermarks, and how far the coordinators got.

    Reached is the later of each partition's positions record in ``<ns>_state`` (what its last
    Kafka transaction committed) and the group's committed offset (the copy the coordinators
    commit after it, for monitoring): either alone may be missing or behind.
    """
    wanted = [(t, p) for t in (topics.half, topics.op) for p in range(partitions)]
    # The coordinators' group id, never subscribed: it reads their committed offsets only.
    client = kafka.consumer(bootstrap, group, extra)
    try:
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in client.committed(kafka.topic_partitions(wanted), _TIMEOUT_S)
        }
        ends = {}
        for topic, p in wanted:
            low, high = client.get_watermark_offsets(kafka.partition_at(topic, p), _TIMEOUT_S, cached=False)
            ends[(topic, p)] = high
            if low == high and committed.get((topic, p), -1) < 0:
                committed[(topic, p)] = high  # nothing there to consume: no lag, known or not
    except Exception as exc:
        raise kafka.to_error(exc, f"reading the positions of {topics.half} and {topics.op}") from exc
    finally:
        client.close()
    for p, where in list_positions(bootstrap, topics.namespace, extra).items():
        for topic, offset in ((topics.half, where.half), (topics.op, where.op)):
            if offset is not None and offset > committed.get((topic, p), -1):
                committed[(topic, p)] = offset
    return ends, committed


def partition_count(bootstrap: str, topic: str, extra: Mapping[str, Any] | None) -> int:
    """How many partitions ``topic`` has (0: it does not exist).

    Raises:
        KafkaOperationError: the cluster did not answer.
    """
    client = kafka.consumer(bootstrap, f"txbridge-console-{uuid.uuid4().hex[:8]}", extra)
    try:
        meta = client.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
    except Exception as exc:
        raise kafka.to_error(exc, f"reading the metadata of {topic}") from exc
    finally:
        client.close()
    return 0 if meta is None or meta.error is not None else len(meta.partitions)


def read_health(
    bootstrap: str,
    namespace: str,
    group: str,
    pending: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> NamespaceHealth:
    """One namespace's health, read from the cluster; what could not be read is in ``error``."""
    topics = Topics(namespace)
    problems = []
    try:
        partitions = partition_count(bootstrap, topics.half, extra)
    except TxBridgeError as exc:
        partitions = 0
        problems.append(str(exc))
    try:
        state, members = read_members(bootstrap, group, topics.half, extra)
    except TxBridgeError as exc:  # shown on the page: the rest of the health still is
        state, members = "unknown", []
        problems.append(str(exc))
    try:
        ends, committed = read_offsets(bootstrap, group, topics, partitions, extra)
    except TxBridgeError as exc:
        ends, committed = {}, {}
        problems.append(str(exc))
    health = assemble(
        namespace,
        group=group,
        group_state=state,
        partitions=partitions,
        members=members,
        ends=ends,
        committed=committed,
        pending=pending,
    )
    health.error = "; ".join(problems)
    return health


def now_ms() -> int:
    return int(time.time() * 1000)
