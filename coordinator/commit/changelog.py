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
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from coordinator.state.partition import HalfRef, PartitionState, PendingTx, Phase
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.wire import (
    OWNER_KEY,
    POSITIONS_KEY,
    YOUNG_PREFIX,
    OpSource,
    OwnerRecord,
    Positions,
    encode_young,
)

logger = logging.getLogger(__name__)

ENTRY_VERSION = 1


@dataclass
class Restored:
    """What :func:`restore` read: the pending transactions and the positions, per partition."""

    pending: dict[int, list[PendingTx]] = field(default_factory=dict)
    positions: dict[int, Positions] = field(default_factory=dict)
    #: The owner records read, in order, per partition (compaction may have removed all but the last).
    owners: dict[int, list[OwnerRecord]] = field(default_factory=dict)


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
    """:meth:`StateReader.restore` with clients of its own, closed after the read."""
    with closing(StateReader(bootstrap, topic, extra)) as reader:
        return reader.restore(partitions, timeout)


def read_owners(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    extra: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> dict[int, OwnerRecord]:
    """:meth:`StateReader.owners` with clients of its own, closed after the read."""
    with closing(StateReader(bootstrap, topic, extra)) as reader:
        return reader.owners(partitions, timeout)


class StateReader:
    """Reads partitions of ``<ns>_state`` from their start, with one consumer and one admin
    client kept from one read to the next.

    A take-over reads twice, the owners before the fence and the changelog after it. On a
    secured cluster a new client's TLS and SASL handshakes with the brokers cost 0.13-0.35 s
    per read, where a kept consumer read the same in 0.02-0.07 s
    (docs/results/2026-11-29-cluster-takeover.md), and the takeover on a cluster is measured
    against a bound it sat on.

    Every read ends at offsets asked of the admin client when it starts, never at a
    partition-EOF event (the consumer makes none): an event queued by an earlier read of the
    same partition could otherwise end a later read before its end. A read that fails closes
    both clients; the next read makes new ones.

    Args:
        bootstrap, topic, extra: the cluster, the ``<ns>_state`` topic and the client settings.
    """

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, Any] | None = None) -> None:
        self._bootstrap, self.topic, self._extra = bootstrap, topic, extra
        self._lock = threading.Lock()  # one read at a time: they share the consumer's assignment
        self._consumer: kafka.Consumer | None = None
        self._admin: kafka.AdminClient | None = None

    def restore(self, partitions: list[int], timeout: float = 60.0) -> Restored:
        """Every live entry and the positions of ``partitions``, read with read_committed to
        the high watermark.

        Not to the last stable offset: a transaction still open on a partition (under an id
        that no owner of it fenced) holds that offset below records that may commit, and
        entries of transactions written after them could be missed, or tombstones above it
        ignored. The read waits for the partition's last stable offset to reach the high
        watermark it had when the read began; a ``timeout`` shorter than the writer's
        transaction timeout turns that wait into an error.

        Returns:
            The pending transactions, positions and owner records; a partition without
            entries, or without a positions record (a namespace an older txbridge served), is
            absent from each.

        Raises:
            KafkaOperationError: the high watermarks were not reached within ``timeout``.
        """
        entries: dict[int, dict[str, PendingTx]] = {}
        out = Restored()
        late = " (an open transaction holds its last stable offset below its high watermark)"
        for msg in self._read(partitions, "restoring", timeout, late):
            partition, value = int(msg.partition() or 0), msg.value()
            if msg.key() == OWNER_KEY:
                self._decoded(msg, OwnerRecord.decode, out.owners.setdefault(partition, []).append)
                continue
            if msg.key() == POSITIONS_KEY:
                self._decoded(msg, Positions.decode, partial(out.positions.__setitem__, partition))
                continue
            live = entries.setdefault(partition, {})
            key = (msg.key() or b"").decode("utf-8", "replace")
            if value is None:
                live.pop(key, None)
            else:
                self._decoded(msg, decode_entry, partial(live.__setitem__, key))
        out.pending = {p: list(txs.values()) for p, txs in entries.items() if txs}
        return out

    def owners(self, partitions: list[int], timeout: float = 60.0) -> dict[int, OwnerRecord]:
        """The last committed owner record of each of ``partitions`` (absent: none, an older
        txbridge's data or a new namespace), read with read_committed to the last stable offset.

        Only to the last stable offset, unlike :meth:`restore`: an owner's claim is committed in
        a transaction of its own before it serves the partition, so every claim of an owner that
        may still hold a transaction open lies below that transaction's first record, hence
        below the last stable offset. The read ends without waiting for the open transaction it
        is about to fence.

        Raises:
            KafkaOperationError: the partitions' ends were not reached within ``timeout``.
        """
        owners: dict[int, OwnerRecord] = {}
        for msg in self._read(partitions, "reading the owners of", timeout, stable=True):
            if msg.key() == OWNER_KEY and msg.value() is not None:
                self._decoded(msg, OwnerRecord.decode, partial(owners.__setitem__, int(msg.partition() or 0)))
        return owners

    def close(self) -> None:
        with self._lock:
            self._discard()

    def _read(
        self, partitions: list[int], what: str, timeout: float, late: str = "", *, stable: bool = False
    ) -> Iterator[kafka.Message]:
        """The records of ``partitions`` from their start to their ends: the high watermarks,
        or the last stable offsets (``stable``), as they are when the read begins."""
        if not partitions:
            return
        with self._lock:
            try:
                ends = self._ends(partitions, stable)
                if not ends:
                    return
                consumer = self._reading()
                consumer.assign([kafka.partition_at(self.topic, p, kafka.FROM_START) for p in ends])
                try:
                    yield from kafka.read_to_end(
                        consumer, self.topic, ends, timeout=timeout, what=f"{what} {self.topic}", late=late
                    )
                finally:
                    consumer.unassign()
            except BaseException:
                self._discard()
                raise

    def _reading(self) -> kafka.Consumer:
        if self._consumer is None:
            self._consumer = kafka.consumer(
                self._bootstrap, f"txbridge-restore-{uuid.uuid4().hex[:8]}", self._extra, fetch_wait_max_ms=10
            )
        return self._consumer

    def _ends(self, partitions: list[int], stable: bool) -> dict[int, int]:
        """Where each partition's read ends; an empty partition (nothing below its end) is left
        out. Warns first when open transactions hold partitions read to their high watermark
        (the read then waits)."""
        if self._admin is None:
            self._admin = kafka.admin(self._bootstrap, self._extra)
        bounds = kafka.offset_bounds(self._admin, self.topic, partitions, timeout=10.0)
        ends = {p: lso if stable else high for p, (_low, lso, high) in bounds.items()}
        ends = {p: end for p, end in ends.items() if end > max(bounds[p][0], 0)}
        held = {p: bounds[p][1:] for p in ends if not stable and bounds[p][1] < bounds[p][2]}
        if held:
            logger.warning(
                "%s: open transactions hold partitions %s (last stable offset, high watermark: %s); "
                "restoring waits until they end (at the latest after their transaction timeout)",
                self.topic,
                sorted(held),
                held,
            )
        return ends

    def _decoded(
        self, msg: kafka.Message, decode: Callable[[bytes], Any], keep: Callable[[Any], Any]
    ) -> None:
        try:
            keep(decode(msg.value() or b""))
        except WireFormatError as exc:
            logger.warning("%s/%d offset %d skipped: %s", self.topic, msg.partition(), msg.offset(), exc)

    def _discard(self) -> None:
        consumer, self._consumer, self._admin = self._consumer, None, None
        if consumer is not None:
            consumer.close()
