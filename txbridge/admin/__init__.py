"""Inspect and settle what the coordinator set aside (rocketmq-dashboard #4343, #4435).

The operators' command over these functions is ``txbridge admin`` (:mod:`cli.admin`);
the coordinator resumes expired transactions with them (:mod:`coordinator.checks.resume`).

Expired transactions. A transaction whose back-checks were exhausted was rolled
back by the coordinator and its half records copied to ``<ns>_expired``. An
operator lists them and resolves one: ``--commit`` republishes its messages from
``<ns>_expired``, ``--rollback`` records the rollback; either way with an
``admin`` op record (the audit trail the coordinator notes).

Quarantined transactions. A committed transaction the coordinator could not
republish (its topic or partition did not exist, a message was too large) was
copied whole to ``<ns>_quarantine``. Once the cause is fixed, ``requeue`` re-drives
it through the coordinator: its messages become the half records of a new
transaction, decided COMMIT by an ``admin`` op record with its message count, and
the coordinator republishes them like any committed transaction (or quarantines
them again if the cause is still there).

Each decision happens at most once per transaction, even with two operators at the
same time: it goes through :func:`txbridge.admin._once.decide_once`, which fences
concurrent admins of the same tx id and keeps a marker beside the copies.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txbridge import kafka
from txbridge.admin._once import RESOLVE, AlreadyDecidedError, Marker, decide_once, decode_marker
from txbridge.admin._quarantine import Quarantined, RequeueResult, list_quarantine, requeue, requeue_all
from txbridge.admin.side_topics import (
    Extra,
    as_dict,
    check_destinations,
    origin_of,
    original,
    produce,
    read_committed,
    reason_of,
)
from txbridge.errors import TxBridgeError, WireFormatError
from txbridge.kafka import Producer
from txbridge.wire import (
    DEFAULT_NAMESPACE,
    H_CHECKS,
    POSITIONS_KEY,
    HalfMessage,
    OpRecord,
    OpSource,
    OwnerRecord,
    Positions,
    ProducerInstance,
    Topics,
    TxState,
    current_positions,
    decode_half,
    decode_op,
    decode_producer,
    decode_young,
    default_coordinator_group,
    header_dict,
    is_owner_key,
    is_positions_key,
    parse_journal_key,
)

__all__ = [
    "AlreadyDecidedError",
    "ExpiredTx",
    "Marker",
    "Quarantined",
    "Registered",
    "RequeueResult",
    "list_expired",
    "list_pending",
    "list_positions",
    "list_producers",
    "list_quarantine",
    "requeue",
    "requeue_all",
    "resolve",
]


@dataclass
class ExpiredTx:
    """An expired transaction as ``<ns>_expired`` holds it."""

    tx_id: str
    group: str = ""
    reason: str = ""
    checks: int = 0
    partition: int | None = None  # its half/op partition (from txb.origin)
    first_offset: int | None = None  # its first half's offset there: the producer's order
    messages: list[HalfMessage] = field(default_factory=list)
    resolved: Marker | None = None  # an admin's decision on it

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})


def list_expired(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None, *, wait_for_open: bool = False
) -> list[ExpiredTx]:
    """Every transaction in ``<ns>_expired``, oldest first, with an admin's decision if any.

    With ``wait_for_open``, expiries whose coordinator's Kafka transaction is still open are
    waited for and listed too (the expiry resumer: a group that returns while an expiry of
    it is being committed must be asked about it); without, only what is committed now.
    """
    found: dict[str, ExpiredTx] = {}
    markers: dict[str, Marker] = {}
    for msg in read_committed(bootstrap, Topics(namespace).expired, wait_for_open=wait_for_open, extra=extra):
        marker = decode_marker(msg.headers(), msg.value())
        if marker is not None:
            markers.setdefault(marker.tx_id, marker)
            continue
        headers = header_dict(msg.headers())
        try:
            half = decode_half(msg.value(), msg.headers())
        except WireFormatError:
            continue  # not a half copy; nothing to resolve
        entry = found.setdefault(half.tx_id, ExpiredTx(half.tx_id, half.group))
        entry.reason = reason_of(headers)
        entry.checks = int(headers.get(H_CHECKS, b"0") or 0)
        _origin, entry.partition, offset = origin_of(headers)
        if offset is not None and (entry.first_offset is None or offset < entry.first_offset):
            entry.first_offset = offset
        if all(m.seq != half.seq for m in entry.messages):
            entry.messages.append(original(half))
    for entry in found.values():
        entry.messages.sort(key=lambda m: m.seq)
        entry.resolved = markers.get(entry.tx_id)
    return list(found.values())


def admin_decisions(
    bootstrap: str, namespace: str, tx_id: str, partition: int, extra: Extra = None
) -> list[OpRecord]:
    """Admin op records written for ``tx_id`` in its op partition (all a resolution left before markers)."""
    ops = []
    for msg in read_committed(bootstrap, Topics(namespace).op, [partition], extra=extra):
        if msg.key() != tx_id.encode():
            continue
        try:
            op = decode_op(msg.value())
        except WireFormatError:
            continue
        if op.source is OpSource.ADMIN:
            ops.append(op)
    return ops


def resolve(
    bootstrap: str,
    tx_id: str,
    state: TxState,
    namespace: str = DEFAULT_NAMESPACE,
    extra: Extra = None,
    *,
    entry: ExpiredTx | None = None,
) -> ExpiredTx:
    """Resolve an expired transaction, at most once; COMMIT republishes its messages.

    One Kafka transaction carries the messages (COMMIT), an ``admin`` op record and the
    decision's marker in ``<ns>_expired``. Concurrent resolutions of one transaction:
    one commits, the others are fenced or see its marker (see :mod:`txbridge.admin._once`).

    Args:
        entry: the transaction as :func:`list_expired` gave it (listed again when None).

    Raises:
        TxBridgeError: the transaction is not in ``<ns>_expired``, or a topic of it is missing.
        AlreadyDecidedError: an admin resolved it before, or at the same time.
        KafkaOperationError: nothing was committed; the message says whether anything was published.
    """
    if state is not TxState.COMMIT and state is not TxState.ROLLBACK:
        raise TxBridgeError("an admin resolution is COMMIT or ROLLBACK")
    topics = Topics(namespace)
    if entry is None:  # the caller may have listed it already (the coordinator's resumer)
        entry = next((e for e in list_expired(bootstrap, namespace, extra) if e.tx_id == tx_id), None)
    if entry is None or entry.partition is None:
        raise TxBridgeError(f"transaction {tx_id} is not in {topics.expired}: see 'txbridge admin expired'")
    if entry.resolved is not None:
        raise AlreadyDecidedError(
            f"transaction {tx_id} was already {entry.resolved.describe()} by an admin", entry.resolved
        )
    if state is TxState.COMMIT:
        check_destinations(bootstrap, entry.messages, extra)
    partition = entry.partition

    def earlier() -> Marker | None:
        # Resolutions made before markers existed left only their admin op record.
        ops = admin_decisions(bootstrap, namespace, tx_id, partition, extra)
        return Marker(tx_id, RESOLVE, ops[0].state, attempt="op") if ops else None

    def write(producer: Producer) -> None:
        if state is TxState.COMMIT:
            for msg in entry.messages:
                headers = msg.republish_headers()
                produce(producer, msg.topic, msg.key, msg.value, headers=headers, partition=msg.partition)
        key, value = OpRecord(
            tx_id, state, OpSource.ADMIN, group=entry.group, reason="txbridge admin"
        ).encode()
        produce(producer, topics.op, key, value, partition=partition)

    draft = Marker(tx_id, RESOLVE, state, attempt="")
    entry.resolved = decide_once(
        bootstrap, namespace, topics.expired, draft, write, earlier=earlier, extra=as_dict(extra)
    )
    return entry


def list_pending(
    bootstrap: str,
    namespace: str = DEFAULT_NAMESPACE,
    group_id: str | None = None,
    extra: Extra = None,
) -> list[dict[str, Any]]:
    """Transactions pending at the coordinators' last commits.

    The live entries of ``<ns>_state``, and the young transactions that the coordinators
    listed instead in their partitions' positions records (phase ``open``, no checks). A
    partition without one (served by an older txbridge) lists them in the committed half
    offset of ``group_id`` (default: the namespace's default group,
    :func:`~txbridge.wire.default_coordinator_group`).
    """
    group_id = group_id or default_coordinator_group(namespace)
    latest = _latest_state(bootstrap, namespace, extra)
    out = []
    for (_partition, key), value in latest.items():
        if value is None or is_owner_key(key) or is_positions_key(key):
            continue
        try:
            out.append(json.loads(value))
        except ValueError:
            continue
    listed = {  # partition -> (half position, young listing)
        p: (where.half, where.young) for p, where in _positions(latest).items() if where.half is not None
    }
    known = {str(e.get("tx")) for e in out}
    young = _young(bootstrap, Topics(namespace).half, group_id, listed, extra=extra)
    out.extend(e for e in young if e["tx"] not in known)
    return sorted(out, key=lambda e: str(e.get("tx", "")))


def _latest_state(bootstrap: str, namespace: str, extra: Extra) -> dict[tuple[int, bytes], bytes | None]:
    """The last committed value of each key of each ``<ns>_state`` partition (None: tombstoned),
    in the order of those values within each partition."""
    latest: dict[tuple[int, bytes], bytes | None] = {}
    for msg in read_committed(bootstrap, Topics(namespace).state, extra=extra):
        where = (msg.partition() or 0, msg.key() or b"")
        latest.pop(where, None)
        latest[where] = msg.value()
    return latest


def list_positions(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None
) -> dict[int, Positions]:
    """Where each partition's last coordinator transaction left half and op: ``{partition: Positions}``.

    A partition no coordinator has committed yet, or served by a txbridge older than positions
    records, is absent.
    """
    return _positions(_latest_state(bootstrap, namespace, extra))


def _positions(latest: Mapping[tuple[int, bytes], bytes | None]) -> dict[int, Positions]:
    """Each partition's positions (:func:`~txbridge.wire.current_positions`) in ``latest``, the
    last value of each key of each ``<ns>_state`` partition, in the order they were written."""
    owners: dict[int, list[tuple[str, int | None]]] = {}
    journals: dict[tuple[str, int], Positions] = {}
    legacy: dict[int, Positions] = {}
    for (partition, key), value in latest.items():
        if value is None:
            continue
        try:
            if is_owner_key(key):
                record = OwnerRecord.decode(value)
                owners.setdefault(partition, []).append((record.transactional_id, record.journal))
            elif key == POSITIONS_KEY:
                legacy[partition] = Positions.decode(value)
            elif (owned := parse_journal_key(key)) is not None:
                journals[owned] = Positions.decode(value)
        except WireFormatError:
            continue
    out = {}
    for partition in sorted({*owners, *legacy}):
        where = current_positions(owners.get(partition, []), journals, partition, legacy.get(partition))
        if where is not None:
            out[partition] = where
    return out


@dataclass(frozen=True)
class Registered:
    """A producer instance as ``<ns>_producers`` holds it.

    Attributes:
        instance: its last heartbeat (group, instance id, check URL, interval, decisive).
        seen_ms: the broker's append time of that heartbeat, which liveness is judged by (the
            heartbeat's own ``ts`` is the producer's clock); its ``ts`` when the topic keeps CreateTime.
    """

    instance: ProducerInstance
    seen_ms: int


def list_producers(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None
) -> list[Registered]:
    """Every producer instance registered in ``<ns>_producers`` and not departed, by group and id.

    An instance that left wrote a tombstone and is not listed; a record that is not a
    heartbeat is skipped.
    """
    latest: dict[bytes, Registered | None] = {}
    for msg in read_committed(bootstrap, Topics(namespace).producers, extra=extra):
        key, value = msg.key() or b"", msg.value()
        if value is None:
            latest[key] = None
            continue
        try:
            beat = decode_producer(value)
        except WireFormatError:
            continue
        seen = kafka.append_time_ms(msg) or beat.timestamp_ms
        current = latest.get(key)
        if current is None or current.seen_ms <= seen:
            latest[key] = Registered(beat, seen)
    found = [r for r in latest.values() if r is not None]
    return sorted(found, key=lambda r: (r.instance.group, r.instance.instance))


def _young(
    bootstrap: str,
    half_topic: str,
    group_id: str,
    listed: dict[int, tuple[int, str]],
    *,
    extra: Extra = None,
    timeout: float = 30.0,
) -> list[dict[str, Any]]:
    """Young transactions listed in the positions records (``listed``), or for a partition
    without one in its committed half offset's metadata, read from their halves."""
    # Same group id, never subscribed: it only reads the group's committed offsets.
    consumer = kafka.consumer(bootstrap, group_id, as_dict(extra))
    try:
        try:
            meta = consumer.list_topics(half_topic, timeout=10).topics.get(half_topic)
            if meta is None or meta.error is not None:
                return []
            older = [kafka.partition_at(half_topic, p) for p in meta.partitions if p not in listed]
            committed = consumer.committed(older, 10) if older else []
        except kafka.KafkaException as exc:  # NOT_COORDINATOR while a new broker loads its offsets, say
            raise kafka.to_error(exc, f"reading the committed offsets of {group_id} on {half_topic}") from exc
        wanted = {tp.partition: decode_young(tp.offset, tp.metadata) for tp in committed if tp.offset > 0}
        wanted.update({p: decode_young(half, young) for p, (half, young) in listed.items() if half > 0})
        found: dict[str, dict[str, Any]] = {}
        for partition, offsets in wanted.items():
            if not offsets:
                continue
            consumer.assign([kafka.partition_at(half_topic, partition, offsets[0])])
            deadline, reached = time.monotonic() + timeout, -1
            while reached < offsets[-1] and time.monotonic() < deadline:
                for msg in kafka.consume_available(consumer, 500, 0.5):
                    if msg.error() is not None:
                        continue
                    reached = max(reached, msg.offset())
                    if msg.offset() not in offsets:
                        continue
                    half = decode_half(msg.value(), msg.headers())
                    entry = found.setdefault(
                        half.tx_id,
                        {
                            "tx": half.tx_id,
                            "p": partition,
                            "phase": "open",
                            "group": half.group,
                            "checks": 0,
                            # as a state entry's "first": its first half's append time
                            "first": kafka.append_time_ms(msg),
                        },
                    )
                    # As a state entry lists its halves: seq, offset, size, topic, base64 key.
                    key = None if half.key is None else base64.b64encode(half.key).decode()
                    size = len(msg.value() or b"")
                    entry.setdefault("halves", []).append([half.seq, msg.offset(), size, half.topic, key])
            consumer.unassign()
        return list(found.values())
    finally:
        consumer.close()
