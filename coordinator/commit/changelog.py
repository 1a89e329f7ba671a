"""``<ns>_state``: the changelog of transactions still pending at a commit boundary.

Key = tx id, value = compact JSON of the pending transaction without payloads
(halves are referenced by offset and re-read from the half topic), null =
resolved. The entry goes to the same partition number as the transaction's half
and op records, so the coordinator that owns partition p restores exactly p.

*Young* transactions get no entry. A young transaction (OPEN, never checked, not
yet due) is all in its half records, so the commit lists its half offsets in the
metadata of the half partition's committed offset instead (:func:`plan`,
``txb1:`` then the distances back from the committed offset, see
:func:`txbridge.wire.encode_young`). Most transactions
are decided within a commit or two, so most commits then write no ``<ns>_state``
record at all: one entry and one tombstone fewer per transaction, and about half
as many partitions in each Kafka transaction. The next owner re-reads the listed
halves (:func:`txbridge.wire.decode_young`); their ops lie after the committed op offset.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.state.partition import HalfRef, PartitionState, PendingTx, Phase
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.wire import (
    POSITIONS_KEY,
    YOUNG_PREFIX,
    OpSource,
    OwnerRecord,
    Positions,
    current_positions,
    encode_young,
    is_owner_key,
    is_positions_key,
    parse_journal_key,
)

logger = logging.getLogger(__name__)

ENTRY_VERSION = 1


@dataclass(frozen=True)
class OwnerRead:
    """One owner record as read from ``<ns>_state``: its key, its offset, and the record (None:
    the key's tombstone)."""

    key: bytes
    offset: int
    record: OwnerRecord | None


def live_owners(reads: list[OwnerRead]) -> list[OwnerRead]:
    """The last record of each owner key that is not deleted, oldest first: what compaction
    keeps of ``reads``."""
    last: dict[bytes, OwnerRead] = {}
    for read in reads:
        last.pop(read.key, None)
        if read.record is not None:
            last[read.key] = read
    return list(last.values())


def claimants(reads: list[OwnerRead]) -> list[str]:
    """The ids of the live claims among ``reads`` (a partition's owner records, in order) that
    are not released, oldest first."""
    return [
        r.record.transactional_id
        for r in live_owners(reads)
        if r.record is not None and not r.record.released
    ]


@dataclass
class Restored:
    """What :func:`restore` read: the pending transactions and the positions, per partition."""

    pending: dict[int, list[PendingTx]] = field(default_factory=dict)
    #: Where each partition stands: in the journal of its last live owner that wrote one, else
    #: its ``legacy`` record.
    positions: dict[int, Positions] = field(default_factory=dict)
    #: The owner records read (tombstones too), in order, per partition.
    owners: dict[int, list[OwnerRead]] = field(default_factory=dict)
    #: The positions record a txbridge from before the journal wrote into ``<ns>_state`` p.
    legacy: dict[int, Positions] = field(default_factory=dict)


@dataclass
class Plan:
    """What one commit records of a partition's pending transactions.

    Attributes:
        entries: transactions that get a ``<ns>_state`` entry.
        young: transactions listed in ``metadata`` instead.
        metadata: the half partition's committed-offset metadata ("" when it lists none).
        tombstones: resolved transactions whose entries are deleted.
    """

    entries: list[PendingTx] = field(default_factory=list)
    tombstones: set[str] = field(default_factory=set)
    young: list[PendingTx] = field(default_factory=list)
    metadata: str = ""


def is_young(tx: PendingTx) -> bool:
    """Everything the coordinator knows of ``tx`` is in its half records (and its op, still unread)."""
    return (
        tx.phase is Phase.OPEN
        and not tx.persisted
        and tx.checks == 0
        and tx.next_check_ms is None
        and tx.half_count() > 0
    )


def plan(state: PartitionState, position: int | None, budget: int) -> Plan:
    """Split the transactions the next commit must cover between entries and young ones.

    Args:
        state: the partition.
        position: the half offset this commit stores (None: entries only).
        budget: the most characters of metadata (0: entries only).
    """
    out = Plan(tombstones=set(state.tombstones))
    offsets: list[int] = []
    used = len(YOUNG_PREFIX)
    for tx in state.unsaved.young_candidates():
        if position is not None and budget > 0 and is_young(tx):
            back = [position - ref.offset for ref in tx.ordered_halves()]
            cost = sum(len(str(b)) + 1 for b in back)
            if all(b > 0 for b in back) and used + cost - 1 <= budget:
                out.young.append(tx)
                offsets.extend(ref.offset for ref in tx.ordered_halves())
                used += cost
                continue
        out.entries.append(tx)
    out.metadata = encode_young(position or 0, offsets)
    return out


def encode_entry(tx: PendingTx) -> bytes:
    """The changelog value of a pending transaction."""

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    body: dict[str, Any] = {
        "v": ENTRY_VERSION,
        "tx": tx.tx_id,
        "p": tx.partition,
        "phase": tx.phase.value,
        "halves": [[seq, h.offset, h.size, h.topic, b64(h.key)] for seq, h in sorted(tx.halves.items())],
        "group": tx.group,
        "instance": tx.instance,
        "first": tx.first_append_ms,
        "check_after": tx.check_after_s,
        "source": tx.decision_source.value if tx.decision_source else None,
        "count": tx.count,
        "wait": tx.wait_offset,
        "checks": tx.checks,
        "next": tx.next_check_ms,
        "order": tx.decided_seq,
    }
    if tx.check_source is not None:  # absent in entries of earlier versions: optional
        body["check_source"] = tx.check_source
    if tx.unasked_since_ms is not None:  # absent in entries of earlier versions: optional
        body["unasked"] = tx.unasked_since_ms
        body["problem"] = tx.problem
    return json.dumps(body, separators=(",", ":")).encode()


def decode_entry(value: bytes) -> PendingTx:
    """Parse a changelog value.

    Raises:
        WireFormatError: the value is not a version-1 entry.
    """
    try:
        body = json.loads(value)
        if body.get("v") != ENTRY_VERSION:
            raise WireFormatError(f"state entry has version {body.get('v')!r}")
        halves = {
            int(seq): HalfRef(
                int(off), int(size), sys.intern(str(topic)), None if key is None else base64.b64decode(key)
            )
            for seq, off, size, topic, key in body["halves"]
        }
        return PendingTx(
            tx_id=str(body["tx"]),
            partition=int(body["p"]),
            phase=Phase(body["phase"]),
            halves=halves,
            group=sys.intern(str(body.get("group", ""))),
            instance=sys.intern(str(body.get("instance", ""))),
            first_append_ms=body.get("first"),
            check_after_s=body.get("check_after"),
            decision_source=OpSource(body["source"]) if body.get("source") else None,
            count=body.get("count"),
            wait_offset=body.get("wait"),
            checks=int(body.get("checks", 0)),
            next_check_ms=body.get("next"),
            decided_seq=int(body.get("order", 0)),
            unasked_since_ms=body.get("unasked"),
            problem=str(body.get("problem", "")),
            check_source=sys.intern(str(body["check_source"])) if body.get("check_source") else None,
        )
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"state entry is not valid: {exc}") from None


def restore(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    extra: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> Restored:
    """Every live entry and the positions of ``partitions`` of ``topic``, read with
    read_committed to the high watermark.

    Not to the last stable offset: a transaction still open on a partition (under an id that
    no owner of it fenced) holds that offset below records that may commit, and entries of
    transactions written after them could be missed, or tombstones above it ignored. The
    read waits for the partition's last stable offset to reach the high watermark it had
    when the read began; a ``timeout`` shorter than the writer's transaction timeout turns
    that wait into an error.

    Returns:
        The pending transactions and the positions; a partition without entries, or without
        a positions record (a namespace an older txbridge served), is absent from either.

    Raises:
        KafkaOperationError: the high watermarks were not reached within ``timeout``.
    """
    if not partitions:
        return Restored()
    ends = _ends(bootstrap, topic, partitions, extra)
    consumer = _state_consumer(bootstrap, extra)
    entries: dict[int, dict[str, PendingTx]] = {}
    out = Restored()
    try:
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in partitions])
        late = " (an open transaction holds its last stable offset below its high watermark)"
        for msg in kafka.read_to_end(
            consumer, topic, ends, timeout=timeout, what=f"restoring {topic}", late=late
        ):
            live = entries.setdefault(int(msg.partition() or 0), {})
            value = msg.value()
            if is_owner_key(msg.key()):
                read = _owner_read(topic, msg)
                if read is not None:
                    out.owners.setdefault(int(msg.partition() or 0), []).append(read)
                continue
            if msg.key() == POSITIONS_KEY:  # written into <ns>_state p by a txbridge before the journal
                number = int(msg.partition() or 0)
                out.legacy.pop(number, None)
                try:
                    if value is not None:
                        out.legacy[number] = Positions.decode(value)
                except WireFormatError as exc:
                    logger.warning("%s/%d offset %d skipped: %s", topic, msg.partition(), msg.offset(), exc)
                continue
            if is_positions_key(msg.key()):  # a journal's: read by owner (_positions)
                continue
            key = (msg.key() or b"").decode("utf-8", "replace")
            if value is None:
                live.pop(key, None)
                continue
            try:
                live[key] = decode_entry(value)
            except WireFormatError as exc:
                logger.warning("%s/%d offset %d skipped: %s", topic, msg.partition(), msg.offset(), exc)
    finally:
        consumer.close()
    out.pending = {p: list(txs.values()) for p, txs in entries.items() if txs}
    out.positions = _positions(bootstrap, topic, partitions, out, extra=extra, timeout=timeout)
    return out


def _positions(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    restored: Restored,
    *,
    extra: Mapping[str, Any] | None,
    timeout: float,
) -> dict[int, Positions]:
    """Where each of ``partitions`` stands (:func:`txbridge.wire.current_positions`), from the
    journals its live owners name, each read to its high watermark (its writer is fenced or
    released: what it wrote has ended; another incarnation sharing the journal holds the read
    only for the commit it has in flight)."""
    owners = {
        p: [
            (r.record.transactional_id, r.record.journal)
            for r in live_owners(restored.owners.get(p, []))
            if r.record
        ]
        for p in partitions
    }
    journals = sorted({j for listed in owners.values() for _, j in listed if j is not None})
    written = read_journals(bootstrap, topic, journals, extra, timeout)
    out = {}
    for p in partitions:
        where = current_positions(owners[p], written, p, restored.legacy.get(p))
        if where is not None:
            out[p] = where
    return out


def read_journals(
    bootstrap: str,
    topic: str,
    journals: list[int],
    extra: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> dict[tuple[str, int], Positions]:
    """Every live positions record of the ``journals`` (``<ns>_state`` partitions), by
    (transactional id, partition), read with read_committed to their high watermarks.

    Raises:
        KafkaOperationError: the high watermarks were not reached within ``timeout``.
    """
    if not journals:
        return {}
    # Not warned: a journal other live incarnations share has their commit in flight.
    ends = _ends(bootstrap, topic, journals, extra, warn=False)
    consumer = _state_consumer(bootstrap, extra)
    out: dict[tuple[str, int], Positions] = {}
    try:
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in journals])
        late = " (an open transaction holds its last stable offset below its high watermark)"
        for msg in kafka.read_to_end(
            consumer, topic, ends, timeout=timeout, what=f"reading the journals of {topic}", late=late
        ):
            owned = parse_journal_key(msg.key())
            if owned is None:
                continue
            value = msg.value()
            out.pop(owned, None)
            try:
                if value is not None:
                    out[owned] = Positions.decode(value)
            except WireFormatError as exc:
                logger.warning("%s/%d offset %d skipped: %s", topic, msg.partition(), msg.offset(), exc)
    finally:
        consumer.close()
    return out


def read_owners(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    extra: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> dict[int, list[OwnerRead]]:
    """The live owner records of each of ``partitions`` (:func:`live_owners`; absent: none, an
    older txbridge's data or a new namespace), read with read_committed to the last stable
    offset.

    Only to the last stable offset, unlike :func:`restore`: an owner's claim is committed in a
    transaction of its own before it serves the partition, so every claim of an owner that may
    still hold a transaction open lies below that transaction's first record, hence below the
    last stable offset. The read ends without waiting for the open transaction it is about to
    fence.

    Raises:
        KafkaOperationError: the partitions' ends were not reached within ``timeout``.
    """
    if not partitions:
        return {}
    consumer = _state_consumer(bootstrap, extra)
    reads: dict[int, list[OwnerRead]] = {}
    try:
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in partitions])
        for msg in kafka.read_to_end(
            consumer, topic, dict.fromkeys(partitions), timeout=timeout, what=f"reading {topic}'s owners"
        ):
            if is_owner_key(msg.key()):
                read = _owner_read(topic, msg)
                if read is not None:
                    reads.setdefault(int(msg.partition() or 0), []).append(read)
    finally:
        consumer.close()
    return {p: live for p, partition_reads in reads.items() if (live := live_owners(partition_reads))}


def _owner_read(topic: str, msg: Any) -> OwnerRead | None:
    """``msg``, an owner key's record, as read; None (logged) when its value is not valid."""
    value = msg.value()
    try:
        record = None if value is None else OwnerRecord.decode(value)
    except WireFormatError as exc:
        logger.warning("%s/%d offset %d skipped: %s", topic, msg.partition(), msg.offset(), exc)
        return None
    return OwnerRead(bytes(msg.key()), int(msg.offset()), record)


def _state_consumer(bootstrap: str, extra: Mapping[str, Any] | None) -> kafka.Consumer:
    """A throwaway consumer for one read of ``<ns>_state`` to its end (never commits)."""
    return kafka.consumer(
        bootstrap,
        f"txbridge-restore-{uuid.uuid4().hex[:8]}",
        extra,
        enable_partition_eof=True,
        fetch_wait_max_ms=10,
    )


def _ends(
    bootstrap: str, topic: str, partitions: list[int], extra: Mapping[str, Any] | None, *, warn: bool = True
) -> dict[int, int | None]:
    """Each partition's high watermark, None for an empty one (read to its partition-EOF); and,
    with ``warn``, a warning first when open transactions hold partitions below it (the read
    then waits)."""
    bounds = kafka.offset_bounds(kafka.admin(bootstrap, extra), topic, partitions, timeout=10.0)
    ends = {p: high if high > max(low, 0) else None for p, (low, _stable, high) in bounds.items()}
    held = {
        p: (stable, high)
        for p, (_low, stable, high) in bounds.items()
        if ends[p] is not None and stable < high
    }
    if held and warn:
        logger.warning(
            "%s: open transactions hold partitions %s (last stable offset, high watermark: %s); "
            "restoring waits until they end (at the latest after their transaction timeout)",
            topic,
            sorted(held),
            held,
        )
    return ends
