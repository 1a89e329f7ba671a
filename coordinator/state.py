"""Pending transactions of one half/op partition: an explicit state machine, no I/O.

A transaction's phases and the allowed transitions are in :data:`TRANSITIONS`;
:meth:`PendingTx.move` is the one guarded setter. The first decision (COMMIT or
ROLLBACK) is final: a later conflicting op is ignored, counted and logged
(RocketMQ #8158, #2694). An op may arrive before its halves.

Readiness of a COMMIT:

- with ``count`` (the producer's COMMIT): every seq ``0..count-1`` has been seen;
- without it (a back-check or admin COMMIT): the coordinator has consumed the half
  partition up to ``wait_offset``, the partition's end offset read after the
  decision arrived. Every half was acknowledged before the decision, so all lie
  below it.

A COMMIT that reached ``wait_offset`` and is still missing halves is *incomplete*
(quarantined if it has halves, an *orphan* op if it has none: typically the
read-back of a decision that was already applied before a restart).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

from txbridge.errors import TransactionStateError
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState

logger = logging.getLogger(__name__)

#: How many resolved tx ids a partition remembers, to recognise late halves and ops.
RESOLVED_MEMORY = 200_000


class Phase(StrEnum):
    OPEN = "open"  # halves seen, no decision: waits for an op or a back-check
    COMMITTED = "committed"  # COMMIT decided, not every half seen yet
    READY = "ready"  # COMMIT and every half seen: republish at the next commit boundary
    PUBLISHED = "published"  # republished to the real topics
    ROLLED_BACK = "rolled_back"
    EXPIRED = "expired"  # back-checks exhausted: rolled back and copied to <ns>_expired
    QUARANTINED = "quarantined"  # committed but could not be republished
    ORPHAN = "orphan"  # a decision for halves this coordinator will never see


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPEN: frozenset(
        {Phase.COMMITTED, Phase.READY, Phase.ROLLED_BACK, Phase.EXPIRED, Phase.QUARANTINED}
    ),
    Phase.COMMITTED: frozenset({Phase.READY, Phase.QUARANTINED, Phase.ORPHAN}),
    Phase.READY: frozenset({Phase.PUBLISHED, Phase.QUARANTINED}),
    Phase.PUBLISHED: frozenset(),
    Phase.ROLLED_BACK: frozenset(),
    Phase.EXPIRED: frozenset(),
    Phase.QUARANTINED: frozenset(),
    Phase.ORPHAN: frozenset(),
}
TERMINAL = frozenset(p for p, nxt in TRANSITIONS.items() if not nxt)


@dataclass(slots=True)
class HalfRef:
    """Where a half record lies; ``message`` is None when its payload was evicted from the cache."""

    offset: int
    size: int
    topic: str = ""  # kept when the payload is evicted: back-check requests name it
    key: bytes | None = None
    message: HalfMessage | None = None


@dataclass(slots=True)
class PendingTx:
    """One transaction not yet resolved on its partition."""

    tx_id: str
    partition: int
    phase: Phase = Phase.OPEN
    halves: dict[int, HalfRef] = field(default_factory=dict)
    group: str = ""
    instance: str = ""
    first_append_ms: int | None = None
    check_after_s: float | None = None
    decision_source: OpSource | None = None
    count: int | None = None
    wait_offset: int | None = None
    checks: int = 0
    next_check_ms: int | None = None
    decided_seq: int = 0  # position in the partition's decision order
    dirty: bool = True  # changed since its last <ns>_state entry
    persisted: bool = False  # has a live <ns>_state entry (tombstone it when resolved)

    def move(self, to: Phase) -> None:
        """The one guarded setter of ``phase``.

        Raises:
            TransactionStateError: ``to`` is not allowed from the current phase.
        """
        if to not in TRANSITIONS[self.phase]:
            raise TransactionStateError(f"tx {self.tx_id}: {self.phase} -> {to} is not allowed")
        self.phase = to
        self.dirty = True

    @property
    def decision(self) -> TxState | None:
        if self.phase in (Phase.COMMITTED, Phase.READY, Phase.PUBLISHED, Phase.QUARANTINED):
            return TxState.COMMIT
        if self.phase in (Phase.ROLLED_BACK, Phase.EXPIRED):
            return TxState.ROLLBACK
        return None

    def complete(self) -> bool:
        """True when every half of a decided COMMIT is known (see the module docstring)."""
        if self.count is not None:
            return all(seq in self.halves for seq in range(self.count))
        return bool(self.halves) and all(seq in self.halves for seq in range(len(self.halves)))

    def ordered_halves(self) -> list[HalfRef]:
        return [self.halves[seq] for seq in sorted(self.halves)]

    def order_key(self) -> bytes:
        """The key that orders this transaction against others: its first message's key, else its id."""
        if self.halves:
            key = self.halves[min(self.halves)].key
            if key is not None:
                return key
        return self.tx_id.encode()

    def first_offset(self) -> int:
        """Offset of its earliest half record seen (its place in the producers' order)."""
        return min((h.offset for h in self.halves.values()), default=-1)

    def cached_bytes(self) -> int:
        return sum(h.size for h in self.halves.values() if h.message is not None)


@dataclass(frozen=True)
class Resolution:
    """A transaction that left the pending set at this step, and why."""

    tx: PendingTx
    reason: str = ""


class PartitionState:
    """The pending transactions of one half/op partition (pure: the service feeds it records).

    Args:
        partition: the half/op partition number.
        stats: shared counters (``conflicting_ops``, ``late_halves``, ...), read by metrics.
        half_position: next half offset to consume (from the committed offsets).
    """

    def __init__(self, partition: int, stats: Counter[str] | None = None, half_position: int = 0) -> None:
        self.partition = partition
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.half_position = half_position
        self.pending: dict[str, PendingTx] = {}
        self.resolved: OrderedDict[str, TxState | None] = OrderedDict()
        self.tombstones: set[str] = set()  # resolved txs whose <ns>_state entry must be deleted
        self._decisions = 0

    # ------------------------------------------------------------------ input

    def add_restored(self, tx: PendingTx) -> None:
        """A transaction restored from ``<ns>_state`` (already persisted there)."""
        tx.persisted, tx.dirty = True, False
        self._decisions = max(self._decisions, tx.decided_seq)
        self.pending[tx.tx_id] = tx

    def on_half(self, msg: HalfMessage, offset: int, size: int, append_ms: int) -> PendingTx | None:
        """Record a half message. Returns its transaction, or None when it was already resolved."""
        self.half_position = max(self.half_position, offset + 1)
        if msg.tx_id in self.resolved:
            self.stats["late_halves"] += 1
            logger.debug("half %s/%d of a resolved transaction ignored", msg.tx_id, msg.seq)
            return None
        tx = self.pending.get(msg.tx_id)
        if tx is None:
            tx = self.pending[msg.tx_id] = PendingTx(msg.tx_id, self.partition)
        if msg.seq in tx.halves:
            self.stats["duplicate_halves"] += 1
            return tx
        tx.halves[msg.seq] = HalfRef(offset, size, msg.topic, msg.key, msg)
        tx.group = tx.group or msg.group
        tx.instance = tx.instance or msg.instance
        if tx.first_append_ms is None:
            tx.first_append_ms = append_ms
            tx.check_after_s = msg.check_after_s
        tx.dirty = True
        self._promote(tx)
        return tx

    def on_op(self, op: OpRecord) -> PendingTx | None:
        """Apply a decision from an op record (or a back-check). Returns the tx when it changed."""
        if op.tx_id in self.resolved:
            self._late_decision(op, self.resolved[op.tx_id])
            return None
        tx = self.pending.get(op.tx_id)
        if tx is None:
            tx = self.pending[op.tx_id] = PendingTx(op.tx_id, self.partition)
            tx.group, tx.instance = op.group, op.instance
        if tx.decision is not None:
            self._late_decision(op, tx.decision)
            return None
        tx.decision_source = op.source
        if op.state is TxState.ROLLBACK:
            tx.move(Phase.ROLLED_BACK)
            self._resolve(tx)
            return tx
        tx.count = op.count
        self._decisions += 1
        tx.decided_seq = self._decisions
        tx.move(Phase.COMMITTED)
        self._promote(tx)
        return tx

    def _late_decision(self, op: OpRecord, decided: TxState | None) -> None:
        if decided is None or op.state is decided:
            self.stats["duplicate_ops"] += 1
            return
        if op.source is OpSource.ADMIN:
            # An admin resolution of an expired tx republishes by itself (txbridge admin).
            self.stats["admin_ops"] += 1
            logger.info("admin %s for tx %s (decided %s) noted", op.state, op.tx_id, decided)
            return
        self.stats["conflicting_ops"] += 1
        logger.warning(
            "tx %s: %s from %s ignored, the first decision %s is final",
            op.tx_id,
            op.state,
            op.source,
            decided,
        )

    def _promote(self, tx: PendingTx) -> None:
        if tx.phase is Phase.COMMITTED and self._complete_now(tx):
            tx.move(Phase.READY)

    def _complete_now(self, tx: PendingTx) -> bool:
        if tx.count is not None:
            return tx.complete()
        return tx.wait_offset is not None and self.half_position >= tx.wait_offset and tx.complete()

    # ------------------------------------------------------------------ waiting for halves

    def needs_end_offset(self) -> bool:
        """True when a COMMIT waits for halves and has no ``wait_offset`` yet."""
        return any(t.phase is Phase.COMMITTED and t.wait_offset is None for t in self.pending.values())

    def set_end_offset(self, end: int) -> None:
        """The half partition's end offset, read after every current decision arrived."""
        for tx in self.pending.values():
            if tx.phase is Phase.COMMITTED and tx.wait_offset is None:
                tx.wait_offset = end
                tx.dirty = True
                self._promote(tx)

    def settle_waits(self) -> list[Resolution]:
        """Promote or give up on COMMITs whose ``wait_offset`` was reached. Returns the given-up ones."""
        out: list[Resolution] = []
        for tx in list(self.pending.values()):
            if tx.phase is not Phase.COMMITTED or tx.wait_offset is None:
                continue
            if self.half_position < tx.wait_offset:
                continue
            self._promote(tx)
            if tx.phase is Phase.READY:
                continue
            if not tx.halves:
                tx.move(Phase.ORPHAN)
                self.stats["orphan_ops"] += 1
                self._resolve(tx)
                continue
            expected = tx.count if tx.count is not None else "?"
            out.append(Resolution(tx, f"incomplete: {len(tx.halves)} of {expected} half records found"))
        return out

    # ------------------------------------------------------------------ output

    def ready_in_order(self) -> list[PendingTx]:
        """READY transactions to republish now, in per-key order.

        Decision order, stopping at the first COMMIT still waiting for halves (the wait
        is bounded by ``wait_offset``). Per key the order is the order the producers
        wrote the half records (their offsets on this partition), not the order the
        decisions arrived: a READY transaction is held while an earlier transaction with
        the same order key is still undecided or incomplete, so one resolved late by a
        back-check (its local commit came first) is not overtaken by a later one of the
        same key; those that go out together are sorted by half offset.
        """
        undecided: dict[bytes, int] = {}
        for tx in self.pending.values():
            if tx.phase in (Phase.OPEN, Phase.COMMITTED) and tx.halves:
                key, offset = tx.order_key(), tx.first_offset()
                undecided[key] = min(undecided.get(key, offset), offset)
        committed = sorted(
            (t for t in self.pending.values() if t.phase in (Phase.COMMITTED, Phase.READY)),
            key=lambda t: t.decided_seq,
        )
        out = []
        for tx in committed:
            if tx.phase is not Phase.READY:
                break
            earlier = undecided.get(tx.order_key())
            if earlier is not None and earlier < tx.first_offset():
                self.stats["held_for_key_order"] += 1
                continue
            out.append(tx)
        out.sort(key=PendingTx.first_offset)
        return out

    def open_txs(self) -> list[PendingTx]:
        return [t for t in self.pending.values() if t.phase is Phase.OPEN]

    def finish(self, tx: PendingTx, phase: Phase) -> None:
        """Move ``tx`` to a terminal ``phase`` and forget it (remembering its id)."""
        tx.move(phase)
        self._resolve(tx)

    def _resolve(self, tx: PendingTx) -> None:
        assert tx.phase in TERMINAL, tx.phase
        self.pending.pop(tx.tx_id, None)
        self.resolved[tx.tx_id] = tx.decision
        if len(self.resolved) > RESOLVED_MEMORY:
            self.resolved.popitem(last=False)
        if tx.persisted:
            self.tombstones.add(tx.tx_id)
        self.stats[f"resolved_{tx.phase.value}"] += 1

    def dirty(self) -> list[PendingTx]:
        """Pending transactions whose ``<ns>_state`` entry is missing or stale."""
        return [t for t in self.pending.values() if t.dirty]

    def mark_persisted(self, txs: list[PendingTx], tombstoned: set[str]) -> None:
        """After a Kafka transaction committed their entries."""
        for tx in txs:
            tx.dirty, tx.persisted = False, True
        self.tombstones -= tombstoned
