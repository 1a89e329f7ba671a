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

Invariants (:meth:`PartitionState.check_invariants`; checked after every step when
``debug`` is set, as the coordinator's ``check_invariants`` setting and the tests do):

- no transaction waits on nothing. An OPEN transaction has halves and a due time: it
  is in the first-check queue, in the check heap at its ``next_check_ms``, or due now
  (a due one in flight has a request that will end, with an answer or a timeout; the
  service then decides it or gives it a new due time). A COMMITTED transaction waits
  for an end offset that the next commit boundary reads (``needs_end_offset``), or
  for ``half_position`` to reach its ``wait_offset``: every consumed half record moves
  ``half_position``, whatever it holds (a quarantined record, a late half), and so does
  the consumer's position past control records (:meth:`PartitionState.read_to`), so the
  wait ends once the partition is read to the end offset. Once reached, ``has_work``
  is true until a boundary settles it: READY or quarantined as incomplete.
- a READY transaction is published at the next boundary unless an earlier undecided
  transaction of its key holds it, and that one is itself OPEN or COMMITTED (so it
  obeys the rule above).

Indexes. A coordinator may hold 100,000 pending transactions and reaches a commit
boundary every few tens of milliseconds, so nothing done at a boundary scans them
all. :class:`PartitionState` keeps indexes that the transitions update (a
transaction tells its owning state when its phase, ``dirty`` or ``next_check_ms``
changes): the dirty ones, the COMMITTED ones (and those without a ``wait_offset``),
COMMITTED/READY in decision order, the undecided ones per order key, a heap of
back-check times, and the bytes of cached payloads. Each boundary method costs
what it returns, not what is pending.

Memory. Per pending transaction the state keeps one :class:`PendingTx`, one
:class:`HalfRef` per half (a transaction with one half has no dict of halves), and
the decoded :class:`~txbridge.wire.HalfMessage` while its payload is cached; topic,
group, instance and header names are interned, so 100,000 transactions of one
producer group share one copy of each.
"""

from __future__ import annotations

import heapq
import logging
import sys
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from coordinator.metrics import Stat, Stats
from txbridge.errors import TransactionStateError
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState

if TYPE_CHECKING:
    from coordinator.scheduler import CheckPolicy

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
#: The counter of each way out of the pending set.
_RESOLVED_STAT = {
    Phase.PUBLISHED: Stat.RESOLVED_PUBLISHED,
    Phase.ROLLED_BACK: Stat.RESOLVED_ROLLED_BACK,
    Phase.EXPIRED: Stat.RESOLVED_EXPIRED,
    Phase.QUARANTINED: Stat.RESOLVED_QUARANTINED,
    Phase.ORPHAN: Stat.RESOLVED_ORPHAN,
}
UNDECIDED = frozenset({Phase.OPEN, Phase.COMMITTED})  # may still hold a later same-key tx back
DECIDED_COMMIT = frozenset({Phase.COMMITTED, Phase.READY})  # in the republish queue


@dataclass(slots=True)
class HalfRef:
    """Where a half record lies; ``message`` is None when its payload was evicted from the cache.

    Change ``message`` through :meth:`PendingTx.set_payload` / :meth:`PendingTx.drop_payloads`
    so that the owning state's byte count stays right.
    """

    offset: int
    size: int
    topic: str = ""  # kept when the payload is evicted: back-check requests name it
    key: bytes | None = None
    message: HalfMessage | None = None


_NO_HALVES: Mapping[int, HalfRef] = MappingProxyType({})


class PendingTx:
    """One transaction not yet resolved on its partition.

    A slotted class rather than a dataclass: ``phase``, ``dirty`` and
    ``next_check_ms`` are properties that keep the owning :class:`PartitionState`'s
    indexes current, and the halves of a one-half transaction (the common case) are
    kept without a dict. ``halves`` is a read-only view; halves are added by the state.
    """

    __slots__ = (
        "_dirty",
        "_halves",
        "_next_check_ms",
        "_owner",
        "_phase",
        "check_after_s",
        "checks",
        "count",
        "decided_seq",
        "decision_source",
        "first_append_ms",
        "group",
        "instance",
        "partition",
        "persisted",
        "problem",
        "tx_id",
        "unasked_since_ms",
        "wait_offset",
    )

    def __init__(
        self,
        tx_id: str,
        partition: int,
        phase: Phase = Phase.OPEN,
        *,
        halves: Mapping[int, HalfRef] | None = None,
        group: str = "",
        instance: str = "",
        first_append_ms: int | None = None,
        check_after_s: float | None = None,
        decision_source: OpSource | None = None,
        count: int | None = None,
        wait_offset: int | None = None,
        checks: int = 0,
        next_check_ms: int | None = None,
        decided_seq: int = 0,
        dirty: bool = True,
        persisted: bool = False,
        unasked_since_ms: int | None = None,
        problem: str = "",
    ) -> None:
        self.tx_id = tx_id
        self.partition = partition
        self._phase = phase
        # None: no half; a HalfRef: exactly seq 0; a dict: anything else.
        self._halves: HalfRef | dict[int, HalfRef] | None = None
        if halves:
            for seq, ref in sorted(halves.items()):
                self._add_half(seq, ref)
        self.group = group
        self.instance = instance
        self.first_append_ms = first_append_ms
        self.check_after_s = check_after_s
        self.decision_source = decision_source
        self.count = count
        self.wait_offset = wait_offset  # set by PartitionState.set_end_offset only
        self.checks = checks
        self._next_check_ms = next_check_ms
        self.decided_seq = decided_seq  # position in the partition's decision order
        self._dirty = dirty  # changed since its last <ns>_state entry
        self.persisted = persisted  # has a live <ns>_state entry (tombstone it when resolved)
        # Since when no back-check could be sent (no live instance, no secret, URL refused),
        # and why; None / "" once one was asked. Not-asked checks do not count in ``checks``.
        self.unasked_since_ms = unasked_since_ms
        self.problem = problem
        self._owner: PartitionState | None = None  # the state whose pending set holds it

    def __repr__(self) -> str:
        return (
            f"PendingTx({self.tx_id!r}, partition={self.partition}, phase={self._phase.value}, "
            f"halves={sorted(self.halves)}, checks={self.checks})"
        )

    # ------------------------------------------------------------------ tracked fields

    @property
    def phase(self) -> Phase:
        """The current phase; changed only by :meth:`move`."""
        return self._phase

    def move(self, to: Phase) -> None:
        """The one guarded setter of ``phase``.

        Raises:
            TransactionStateError: ``to`` is not allowed from the current phase.
        """
        before = self._phase
        if to not in TRANSITIONS[before]:
            raise TransactionStateError(f"tx {self.tx_id}: {before} -> {to} is not allowed")
        self._phase = to
        self.dirty = True
        if self._owner is not None:
            self._owner._moved(self, before)

    @property
    def dirty(self) -> bool:
        """Changed since its last ``<ns>_state`` entry."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if self._owner is not None:
            self._owner._dirty_changed(self)

    @property
    def next_check_ms(self) -> int | None:
        """When to back-check it next (coordinator clock); None until first scheduled."""
        return self._next_check_ms

    @next_check_ms.setter
    def next_check_ms(self, value: int | None) -> None:
        self._next_check_ms = value
        if self._owner is not None:
            self._owner._rescheduled(self)

    # ------------------------------------------------------------------ halves

    @property
    def halves(self) -> Mapping[int, HalfRef]:
        """seq -> half (read-only)."""
        h = self._halves
        if h is None:
            return _NO_HALVES
        return MappingProxyType({0: h} if isinstance(h, HalfRef) else h)

    def _add_half(self, seq: int, ref: HalfRef) -> bool:
        """Add a half; False when that seq is already known."""
        h = self._halves
        if h is None:
            self._halves = ref if seq == 0 else {seq: ref}
        elif isinstance(h, HalfRef):
            if seq == 0:
                return False
            self._halves = {0: h, seq: ref}
        elif seq in h:
            return False
        else:
            h[seq] = ref
        return True

    def has_half(self, seq: int) -> bool:
        h = self._halves
        if h is None or isinstance(h, HalfRef):
            return h is not None and seq == 0
        return seq in h

    def half_count(self) -> int:
        h = self._halves
        return 0 if h is None else 1 if isinstance(h, HalfRef) else len(h)

    def _first_half(self) -> HalfRef | None:
        h = self._halves
        if h is None or isinstance(h, HalfRef):
            return h
        return h[min(h)]

    def ordered_halves(self) -> list[HalfRef]:
        h = self._halves
        if h is None:
            return []
        if isinstance(h, HalfRef):
            return [h]
        return [h[seq] for seq in sorted(h)]

    def complete(self) -> bool:
        """True when every half of a decided COMMIT is known (see the module docstring)."""
        h = self._halves
        if self.count is None and h is None:
            return False
        wanted = self.count if self.count is not None else self.half_count()
        if h is None or isinstance(h, HalfRef):
            return wanted <= (0 if h is None else 1)
        return all(seq in h for seq in range(wanted))

    def order_key(self) -> bytes:
        """The key that orders this transaction against others: its first message's key, else its id."""
        first = self._first_half()
        if first is not None and first.key is not None:
            return first.key
        return self.tx_id.encode()

    def first_offset(self) -> int:
        """Offset of its earliest half record seen (its place in the producers' order)."""
        h = self._halves
        if h is None:
            return -1
        if isinstance(h, HalfRef):
            return h.offset
        return min(ref.offset for ref in h.values())

    # ------------------------------------------------------------------ payloads

    def cached_bytes(self) -> int:
        h = self._halves
        if h is None:
            return 0
        if isinstance(h, HalfRef):
            return h.size if h.message is not None else 0
        return sum(ref.size for ref in h.values() if ref.message is not None)

    def set_payload(self, ref: HalfRef, message: HalfMessage) -> None:
        """Put a re-read payload back into ``ref`` (one of this transaction's halves)."""
        if ref.message is None and self._owner is not None:
            self._owner.payload_bytes += ref.size
        ref.message = message

    def drop_payloads(self) -> int:
        """Evict every cached payload of this transaction. Returns the bytes dropped."""
        dropped = 0
        for ref in self.ordered_halves():
            if ref.message is not None:
                ref.message = None
                dropped += ref.size
        if self._owner is not None:
            self._owner.payload_bytes -= dropped
        return dropped

    @property
    def decision(self) -> TxState | None:
        if self._phase in (Phase.COMMITTED, Phase.READY, Phase.PUBLISHED, Phase.QUARANTINED):
            return TxState.COMMIT
        if self._phase in (Phase.ROLLED_BACK, Phase.EXPIRED):
            return TxState.ROLLBACK
        return None


@dataclass(frozen=True)
class Resolution:
    """A transaction that left the pending set at this step, and why."""

    tx: PendingTx
    reason: str = ""


@dataclass(frozen=True)
class Due:
    """What to do now: transactions to check and transactions to expire."""

    check: list[PendingTx]
    expire: list[PendingTx]


def _intern_message(msg: HalfMessage) -> HalfMessage:
    """``msg`` sharing the strings that repeat across transactions: topic, group, instance, header names.

    A copy only when one of them is not interned yet (``decode_half`` may intern them itself).
    """
    topic, group, instance = sys.intern(msg.topic), sys.intern(msg.group), sys.intern(msg.instance)
    names_shared = all(sys.intern(name) is name for name, _ in msg.user_headers)
    if msg.topic is topic and msg.group is group and msg.instance is instance and names_shared:
        return msg
    headers = msg.user_headers
    if not names_shared:
        headers = tuple((sys.intern(name), value) for name, value in headers)
    return replace(msg, topic=topic, group=group, instance=instance, user_headers=headers)


class PartitionState:
    """The pending transactions of one half/op partition (pure: the service feeds it records).

    Args:
        partition: the half/op partition number.
        stats: the coordinator's counters (:class:`coordinator.metrics.Stat`), read by metrics.
        half_position: next half offset to consume (from the committed offsets).

    Attributes:
        pending: tx id -> transaction (read it; change it through this class).
        tombstones: resolved txs whose ``<ns>_state`` entry must be deleted.
        payload_bytes: sizes of the half payloads currently cached in ``pending``.
    """

    #: Stale entries the check heap and FIFO may hold beyond twice the pending count before a rebuild.
    CHECK_HEAP_SLACK = 1024
    #: Check :meth:`check_invariants` after every step (tests, and the ``check_invariants`` setting).
    debug = False

    def __init__(self, partition: int, stats: Stats | None = None, half_position: int = 0) -> None:
        self.partition = partition
        self.stats: Stats = stats if stats is not None else Counter()
        self.half_position = half_position
        self.pending: dict[str, PendingTx] = {}
        self.tombstones: set[str] = set()
        self.payload_bytes = 0
        self._decisions = 0
        # Resolved ids and their decision; a deque remembers which to forget first.
        self._resolved: dict[str, TxState | None] = {}
        self._resolved_order: deque[str] = deque()
        self._orphaned: set[str] = set()  # of _resolved: COMMITs given up with no half seen
        # Indexes (see the module docstring), kept by _adopt, _moved, _dirty_changed,
        # _rescheduled and _resolve.
        self._dirty: dict[str, PendingTx] = {}
        self._committed: dict[str, PendingTx] = {}  # phase COMMITTED
        self._awaiting_end: dict[str, PendingTx] = {}  # COMMITTED with no wait_offset yet
        self._decided: dict[str, PendingTx] = {}  # COMMITTED or READY, in decided_seq order ...
        self._decided_sorted = True  # ... unless a restored one came out of order
        self._ready = 0  # how many are READY
        # order key -> the undecided transaction(s) with halves and that key (keyless ones
        # order only against themselves and are not indexed)
        self._by_key: dict[bytes, PendingTx | list[PendingTx]] = {}
        # First checks of new OPEN transactions without txb.check_after, in arrival order:
        # their due times (append time + check delay) follow it, so a FIFO of ids does (8 B
        # each, and no next_check_ms until due) what a heap entry would (64 B).
        self._first_checks: deque[str] = deque()
        # (due ms, tx id): the other OPEN transactions by next_check_ms, or by first_append_ms
        # while unscheduled; stale entries are skipped when popped and dropped by _compact_checks.
        self._checks: list[tuple[int, str]] = []
        self._due: dict[str, PendingTx] = {}  # OPEN, next_check_ms reached: due until rescheduled
        # Young transactions the last commit carried as half offsets in the committed offset's
        # metadata instead of as <ns>_state entries (see coordinator.changelog.plan).
        self._young: dict[str, PendingTx] = {}

    # ------------------------------------------------------------------ input

    def add_restored(self, tx: PendingTx) -> None:
        """A transaction restored from ``<ns>_state`` (already persisted there)."""
        tx.persisted, tx._dirty = True, False
        self._decisions = max(self._decisions, tx.decided_seq)
        self._adopt(tx)
        if self.debug:
            self.check_invariants()

    def read_to(self, position: int) -> None:
        """The half partition is consumed up to ``position`` (exclusive).

        Every consumed record moves it, whatever it holds: a record that is quarantined or
        ignored, and (from the consumer's position) control records and aborted records too.
        A COMMIT without a count waits for this to reach its ``wait_offset``; counting only
        the half records that decoded left it waiting forever when the partition's last
        record was malformed (issue 13).
        """
        self.half_position = max(self.half_position, position)
        if self.debug:
            self.check_invariants()

    def on_half(self, msg: HalfMessage, offset: int, size: int, append_ms: int) -> PendingTx | None:
        """Record a half message. Returns its transaction, or None when it was already resolved."""
        tx = self._on_half(msg, offset, size, append_ms)
        if self.debug:
            self.check_invariants()
        return tx

    def _on_half(self, msg: HalfMessage, offset: int, size: int, append_ms: int) -> PendingTx | None:
        self.half_position = max(self.half_position, offset + 1)
        if msg.tx_id in self._resolved:
            self.stats[Stat.LATE_HALVES] += 1
            if msg.tx_id in self._orphaned:
                # Its COMMIT was read, then the half partition's end offset read after it was
                # reached with no half: the writer sent the op before its halves were
                # acknowledged (the SDK never does; docs/wire-format.md). Not republished.
                logger.warning(
                    "tx %s of group %r: a half came after its COMMIT was given up for want of halves; "
                    "its writer must not send the op before its half records are acknowledged",
                    msg.tx_id,
                    msg.group,
                )
                self._orphaned.discard(msg.tx_id)
            else:
                logger.debug("half %s/%d of a resolved transaction ignored", msg.tx_id, msg.seq)
            return None
        tx = self.pending.get(msg.tx_id)
        new = tx is None
        if tx is None:
            tx = PendingTx(msg.tx_id, self.partition)
        elif tx.has_half(msg.seq):
            self.stats[Stat.DUPLICATE_HALVES] += 1
            return tx
        msg = _intern_message(msg)
        reindex = tx._phase in UNDECIDED and not new
        if reindex:
            self._unindex_key(tx)
        tx._add_half(msg.seq, HalfRef(offset, size, msg.topic, msg.key, msg))
        tx.group = tx.group or msg.group
        tx.instance = tx.instance or msg.instance
        if tx.first_append_ms is None:
            tx.first_append_ms = append_ms
            tx.check_after_s = msg.check_after_s
        if new:
            self._adopt(tx, arriving=True)  # indexes it by key, payload bytes, check time
        else:
            self.payload_bytes += size
            if reindex:
                self._index_key(tx)
            tx.dirty = True
        self._promote(tx)
        return tx

    def on_op(self, op: OpRecord) -> PendingTx | None:
        """Apply a decision from an op record (or a back-check). Returns the tx when it changed."""
        tx = self._on_op(op)
        if self.debug:
            self.check_invariants()
        return tx

    def _on_op(self, op: OpRecord) -> PendingTx | None:
        if op.tx_id in self._resolved:
            self._late_decision(op, self._resolved[op.tx_id])
            return None
        tx = self.pending.get(op.tx_id)
        if tx is None:
            group, instance = sys.intern(op.group), sys.intern(op.instance)
            tx = PendingTx(op.tx_id, self.partition, group=group, instance=instance)
            self._adopt(tx)
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
            self.stats[Stat.DUPLICATE_OPS] += 1
            return
        if op.source is OpSource.ADMIN:
            # An admin resolution of an expired tx republishes by itself (txbridge admin).
            self.stats[Stat.ADMIN_OPS] += 1
            logger.info("admin %s for tx %s (decided %s) noted", op.state, op.tx_id, decided)
            return
        self.stats[Stat.CONFLICTING_OPS] += 1
        logger.warning(
            "tx %s: %s from %s ignored, the first decision %s is final",
            op.tx_id,
            op.state,
            op.source,
            decided,
        )

    def _promote(self, tx: PendingTx) -> None:
        if tx._phase is Phase.COMMITTED and self._complete_now(tx):
            tx.move(Phase.READY)

    def _complete_now(self, tx: PendingTx) -> bool:
        if tx.count is not None:
            return tx.complete()
        return tx.wait_offset is not None and self.half_position >= tx.wait_offset and tx.complete()

    # ------------------------------------------------------------------ waiting for halves

    def needs_end_offset(self) -> bool:
        """True when a COMMIT waits for halves and has no ``wait_offset`` yet."""
        return any(t.wait_offset is None for t in self._awaiting_end.values())

    def set_end_offset(self, end: int) -> None:
        """The half partition's end offset, read after every current decision arrived."""
        waiting = list(self._awaiting_end.values())
        self._awaiting_end.clear()
        for tx in waiting:
            if tx._phase is Phase.COMMITTED and tx.wait_offset is None:
                tx.wait_offset = end
                tx.dirty = True
                self._promote(tx)
        if self.debug:
            self.check_invariants()

    def settle_waits(self) -> list[Resolution]:
        """Promote or give up on COMMITs whose ``wait_offset`` was reached. Returns the given-up ones."""
        out: list[Resolution] = []
        reached = [
            t
            for t in self._committed.values()
            if t.wait_offset is not None and self.half_position >= t.wait_offset
        ]
        for tx in reached:
            self._promote(tx)
            if tx._phase is Phase.READY:
                continue
            if tx._halves is None:
                tx.move(Phase.ORPHAN)
                self.stats[Stat.ORPHAN_OPS] += 1
                self._resolve(tx)
                self._orphaned.add(tx.tx_id)
                continue
            expected = tx.count if tx.count is not None else "?"
            out.append(Resolution(tx, f"incomplete: {tx.half_count()} of {expected} half records found"))
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
        if not self._ready:
            return []
        if not self._decided_sorted:
            self._decided = dict(sorted(self._decided.items(), key=lambda item: item[1].decided_seq))
            self._decided_sorted = True
        out = []
        for tx in self._decided.values():
            if tx._phase is not Phase.READY:
                break
            earlier = self._earliest_undecided(tx.order_key())
            if earlier is not None and earlier < tx.first_offset():
                self.stats[Stat.HELD_FOR_KEY_ORDER] += 1
                continue
            out.append(tx)
        out.sort(key=PendingTx.first_offset)
        return out

    def open_txs(self) -> list[PendingTx]:
        """Every OPEN transaction (a scan: the service schedules checks with :meth:`due_checks`)."""
        return [t for t in self.pending.values() if t._phase is Phase.OPEN]

    def due_checks(self, policy: CheckPolicy, now_ms: int, in_flight: set[str]) -> Due:
        """OPEN transactions whose back-check time has come (``in_flight`` ones are skipped).

        The same answer as a scan of :meth:`open_txs` (tests/coordinator/test_scheduler.py),
        except that a transaction gets its first ``next_check_ms`` when that time comes
        rather than at the first call; at the cost of the due transactions rather than of
        all open ones. A due transaction is returned at every call until its
        ``next_check_ms`` changes or it is decided.

        First checks without ``txb.check_after`` are taken in arrival order, which is the
        order of their due times as long as append times do not go backwards (the half
        topic keeps LogAppendTime); a broker clock stepping back delays the later ones by
        at most the step.
        """
        first = self._first_checks
        while first:
            tx = self.pending.get(first[0])
            if tx is None or tx._phase is not Phase.OPEN or tx._next_check_ms is not None:
                first.popleft()  # decided, or scheduled by another path
                continue
            at = policy.first_due_ms(tx, now_ms)
            if at > now_ms:
                break
            first.popleft()
            tx._next_check_ms = at  # due now: straight to _due, no heap entry needed
            tx.dirty = True
            self._due[tx.tx_id] = tx
        while self._checks and self._checks[0][0] <= now_ms:  # not aliased: a push may compact it
            at, tx_id = heapq.heappop(self._checks)
            tx = self.pending.get(tx_id)
            if tx is None or tx._phase is not Phase.OPEN:
                continue
            if tx._next_check_ms is None:  # an unscheduled entry (keyed by first_append_ms)
                tx.next_check_ms = policy.first_due_ms(tx, now_ms)  # pushes its real entry
                tx.dirty = True
            elif tx._next_check_ms == at:
                self._due[tx_id] = tx
        check: list[PendingTx] = []
        expire: list[PendingTx] = []
        for tx in self._due.values():
            if tx.tx_id in in_flight:
                continue
            (expire if policy.exhausted(tx, now_ms) else check).append(tx)
        if self.debug:
            self.check_invariants()
        return Due(check, expire)

    def expedite(self, group: str, instance: str, now_ms: int) -> int:
        """Make the OPEN transactions written by ``instance`` of ``group`` due now (its writer is
        gone and another instance answers decisively). Returns how many. A scan: called when a
        writer goes silent or leaves, not per record."""
        count = 0
        for tx in self.pending.values():
            if (
                tx._phase is Phase.OPEN
                and tx._halves is not None
                and tx.group == group
                and tx.instance == instance
                and (tx._next_check_ms is None or tx._next_check_ms > now_ms)
            ):
                tx.next_check_ms = now_ms  # pushes a heap entry due now (a first-check entry goes stale)
                tx.dirty = True
                count += 1
        if self.debug:
            self.check_invariants()
        return count

    def unsaved_changes(self) -> bool:
        """Changes that only a commit would write: a dirty transaction, a tombstone."""
        return bool(self._dirty or self.tombstones)

    def has_work(self) -> bool:
        """Something for the next commit boundary: a tombstone, a dirty or READY tx, an end offset to
        read, a COMMIT whose wait for halves is over."""
        return bool(
            self.tombstones or self._dirty or self._ready or self.needs_end_offset() or self.waits_reached()
        )

    def waits_reached(self) -> bool:
        """True when a COMMIT's ``wait_offset`` was reached: the next boundary publishes or quarantines it."""
        position = self.half_position
        return any(t.wait_offset is not None and position >= t.wait_offset for t in self._committed.values())

    def check_invariants(self) -> None:
        """Raise AssertionError when a pending transaction waits on nothing (see the module docstring).

        Costs a pass over every pending transaction: for tests and the ``check_invariants``
        setting, not for production.
        """
        heap = {(at, tx_id) for at, tx_id in self._checks}
        first = set(self._first_checks)
        counts: Counter[Phase] = Counter()
        for tx_id, tx in self.pending.items():
            counts[tx._phase] += 1
            why = self._broken(tx_id, tx, heap, first)
            if why:
                raise AssertionError(f"partition {self.partition}: {tx!r} {why}")
        if counts[Phase.READY] != self._ready:
            raise AssertionError(f"partition {self.partition}: {self._ready} READY counted, not {counts}")
        if counts[Phase.COMMITTED] != len(self._committed):
            raise AssertionError(f"partition {self.partition}: the COMMITTED index has stale entries")
        if any(t._owner is not self for t in self._due.values()):
            raise AssertionError(f"partition {self.partition}: a due transaction is no longer pending")

    def _broken(self, tx_id: str, tx: PendingTx, heap: set[tuple[int, str]], first: set[str]) -> str:
        """Which invariant ``tx`` breaks ("" for none)."""
        phase, nxt = tx._phase, tx._next_check_ms
        scheduled = (
            tx_id in self._due
            or (nxt is not None and (nxt, tx_id) in heap)
            or (nxt is None and (tx_id in first or (tx.first_append_ms or 0, tx_id) in heap))
        )
        committed = phase is Phase.COMMITTED
        rules = [
            (tx._owner is not self or tx.tx_id != tx_id, "is not indexed under its own id"),
            (phase in TERMINAL, "is terminal but still pending"),
            ((tx_id in self._dirty) != tx._dirty, "has a dirty flag the dirty index does not match"),
            (phase is Phase.OPEN and tx._halves is None, "is OPEN without halves: nothing will check it"),
            (phase is Phase.OPEN and not scheduled, "is OPEN with no due time: it would never be checked"),
            (
                committed and (tx_id not in self._committed or tx_id not in self._decided),
                "is COMMITTED but not in the committed indexes",
            ),
            (
                committed and tx.wait_offset is None and tx_id not in self._awaiting_end,
                "is COMMITTED with no wait_offset and no end offset coming",
            ),
            (phase is Phase.READY and tx_id not in self._decided, "is READY but not in the republish queue"),
        ]
        return next((why for broken, why in rules if broken), "")

    def finish(self, tx: PendingTx, phase: Phase) -> None:
        """Move ``tx`` to a terminal ``phase`` and forget it (remembering its id)."""
        tx.move(phase)
        self._resolve(tx)
        if self.debug:
            self.check_invariants()

    def dirty(self) -> list[PendingTx]:
        """Pending transactions whose ``<ns>_state`` entry is missing or stale."""
        return list(self._dirty.values())

    def young_candidates(self) -> list[PendingTx]:
        """What the next commit must cover: the young transactions so far, then the dirty ones."""
        young = self._young
        return [*young.values(), *(t for t in self._dirty.values() if t.tx_id not in young)]

    def mark_persisted(
        self, txs: list[PendingTx], tombstoned: set[str], young: list[PendingTx] | None = None
    ) -> None:
        """After a Kafka transaction committed ``txs``' entries and listed ``young`` in its offsets."""
        for tx in txs:
            tx.dirty, tx.persisted = False, True
        self._young = {}
        for tx in young or ():
            if tx._owner is self:  # still pending here
                tx.dirty = False
                self._young[tx.tx_id] = tx
        if not self._dirty:
            self._dirty = {}  # a dict keeps its largest table until refilled: let it go
        self.tombstones -= tombstoned
        if self.debug:
            self.check_invariants()

    # ------------------------------------------------------------------ indexes

    def _adopt(self, tx: PendingTx, *, arriving: bool = False) -> None:
        """Make ``tx`` pending here and index it by its current fields.

        ``arriving``: its first half was just consumed (so it is the latest to arrive).
        """
        tx._owner = self
        self.pending[tx.tx_id] = tx
        if tx._dirty:
            self._dirty[tx.tx_id] = tx
        if tx._halves is not None:
            self.payload_bytes += tx.cached_bytes()
        phase = tx._phase
        if phase is Phase.READY:
            self._ready += 1
        if phase is Phase.COMMITTED:
            self._committed[tx.tx_id] = tx
            if tx.wait_offset is None:
                self._awaiting_end[tx.tx_id] = tx
        if phase in DECIDED_COMMIT:
            self._add_decided(tx)
        if phase in UNDECIDED:
            self._index_key(tx)
        if phase is Phase.OPEN and tx._halves is not None:
            if arriving and tx._next_check_ms is None and tx.check_after_s is None:
                self._first_checks.append(tx.tx_id)
                self._maybe_compact_checks()
            else:
                at = tx._next_check_ms if tx._next_check_ms is not None else tx.first_append_ms or 0
                self._push_check(at, tx.tx_id)

    def _moved(self, tx: PendingTx, before: Phase) -> None:
        """``tx`` went from ``before`` to its current phase."""
        after, tx_id = tx._phase, tx.tx_id
        if before is Phase.READY:
            self._ready -= 1
        if after is Phase.READY:
            self._ready += 1
        if before is Phase.COMMITTED:
            self._committed.pop(tx_id, None)
            self._awaiting_end.pop(tx_id, None)
        if after is Phase.COMMITTED:
            self._committed[tx_id] = tx
            if tx.wait_offset is None:
                self._awaiting_end[tx_id] = tx
        if before in DECIDED_COMMIT and after not in DECIDED_COMMIT:
            self._decided.pop(tx_id, None)
        elif after in DECIDED_COMMIT and before not in DECIDED_COMMIT:
            self._add_decided(tx)
        if before in UNDECIDED and after not in UNDECIDED:
            self._unindex_key(tx)
        if before is Phase.OPEN:
            self._due.pop(tx_id, None)

    def _dirty_changed(self, tx: PendingTx) -> None:
        if tx._dirty:
            self._dirty[tx.tx_id] = tx
        else:
            self._dirty.pop(tx.tx_id, None)

    def _rescheduled(self, tx: PendingTx) -> None:
        self._due.pop(tx.tx_id, None)
        if tx._phase is Phase.OPEN and tx._next_check_ms is not None:
            self._push_check(tx._next_check_ms, tx.tx_id)

    def _push_check(self, at: int, tx_id: str) -> None:
        heapq.heappush(self._checks, (at, tx_id))
        self._maybe_compact_checks()

    def _maybe_compact_checks(self) -> None:
        if len(self._checks) + len(self._first_checks) > 2 * len(self.pending) + self.CHECK_HEAP_SLACK:
            self._compact_checks()

    def _compact_checks(self) -> None:
        """Rebuild the check heap and FIFO from the OPEN transactions (drops entries of decided ones)."""
        entries, first = [], []
        for tx in self.pending.values():
            if tx._phase is Phase.OPEN and tx._halves is not None:
                nxt = tx._next_check_ms
                if nxt is None and tx.check_after_s is None:
                    first.append((tx.first_append_ms or 0, tx.tx_id))
                else:
                    entries.append((nxt if nxt is not None else tx.first_append_ms or 0, tx.tx_id))
        heapq.heapify(entries)
        first.sort()
        self._checks = entries
        self._first_checks = deque(tx_id for _, tx_id in first)

    def _add_decided(self, tx: PendingTx) -> None:
        if self._decided and tx.decided_seq < next(reversed(self._decided.values())).decided_seq:
            self._decided_sorted = False
        self._decided[tx.tx_id] = tx

    def _index_key(self, tx: PendingTx) -> None:
        first = tx._first_half()
        if first is None or first.key is None:
            return
        held = self._by_key.get(first.key)
        if held is None:
            self._by_key[first.key] = tx
        elif isinstance(held, list):
            held.append(tx)
        else:
            self._by_key[first.key] = [held, tx]

    def _unindex_key(self, tx: PendingTx) -> None:
        first = tx._first_half()
        if first is None or first.key is None:
            return
        held = self._by_key.get(first.key)
        if held is tx:
            del self._by_key[first.key]
        elif isinstance(held, list):
            held.remove(tx)
            if len(held) == 1:
                self._by_key[first.key] = held[0]

    def _earliest_undecided(self, key: bytes) -> int | None:
        held = self._by_key.get(key)
        if held is None:
            return None
        if isinstance(held, list):
            return min(t.first_offset() for t in held)
        return held.first_offset()

    def _resolve(self, tx: PendingTx) -> None:
        assert tx._phase in TERMINAL, tx._phase
        tx_id = tx.tx_id
        if self.pending.pop(tx_id, None) is tx:
            self._dirty.pop(tx_id, None)
            self._young.pop(tx_id, None)
            self.payload_bytes -= tx.cached_bytes()
            tx._owner = None
        if tx_id not in self._resolved:
            self._resolved_order.append(tx_id)
        self._resolved[tx_id] = tx.decision
        if len(self._resolved_order) > RESOLVED_MEMORY:
            forgotten = self._resolved_order.popleft()
            del self._resolved[forgotten]
            self._orphaned.discard(forgotten)
        if tx.persisted:
            self.tombstones.add(tx_id)
        self.stats[_RESOLVED_STAT[tx._phase]] += 1
