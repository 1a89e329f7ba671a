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
COMMITTED/READY in decision order, the undecided ones per message key, a heap of
back-check times, and the bytes of cached payloads. Each boundary method costs
what it returns, not what is pending.

Memory. Per pending transaction the state keeps one :class:`PendingTx`, one
:class:`HalfRef` per half (a transaction with one half has no dict of halves), and
the decoded :class:`~txbridge.wire.HalfMessage` while its payload is cached; topic,
group, instance and header names are interned, so 100,000 transactions of one
producer group share one copy of each.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state.check_queue import CheckQueue, Due
from coordinator.state.commit_order import CommitOrder
from coordinator.state.key_order import KeyOrder
from coordinator.state.pending import HalfRef, PendingTx
from coordinator.state.phase import TERMINAL, TRANSITIONS, UNDECIDED, Phase
from coordinator.state.resolved import ResolvedMemory
from coordinator.state.unsaved import UnsavedChanges
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState

if TYPE_CHECKING:
    from coordinator.state.scheduler import CheckPolicy

# The phases, the transaction and the due checks live in their own modules; importers of
# the partition state get them here too.
__all__ = [
    "RESOLVED_MEMORY",
    "TRANSITIONS",
    "Due",
    "HalfRef",
    "PartitionState",
    "PendingTx",
    "Phase",
    "Resolution",
]

logger = logging.getLogger(__name__)

#: How many resolved tx ids a partition remembers, to recognise late halves and ops.
RESOLVED_MEMORY = 200_000


#: The counter of each way out of the pending set.
_RESOLVED_STAT = {
    Phase.PUBLISHED: Stat.RESOLVED_PUBLISHED,
    Phase.ROLLED_BACK: Stat.RESOLVED_ROLLED_BACK,
    Phase.EXPIRED: Stat.RESOLVED_EXPIRED,
    Phase.QUARANTINED: Stat.RESOLVED_QUARANTINED,
    Phase.ORPHAN: Stat.RESOLVED_ORPHAN,
}


@dataclass(frozen=True)
class Resolution:
    """A transaction that left the pending set at this step, and why."""

    tx: PendingTx
    reason: str = ""


_P = ParamSpec("_P")
_R = TypeVar("_R")


#: The steps after which a ``debug`` state checks its invariants (marked by :func:`_checked`).
_CHECKED_STEPS: list[str] = []


def _checked(
    step: Callable[Concatenate[PartitionState, _P], _R],
) -> Callable[Concatenate[PartitionState, _P], _R]:
    """Marks ``step``: a ``debug`` state checks :meth:`PartitionState.check_invariants` after it.

    Only a ``debug`` state wraps its steps (on the instance, at construction), so that a
    coordinator without the setting pays nothing per step for it
    (docs/results/2026-11-28-producer-path.md).
    """
    _CHECKED_STEPS.append(step.__name__)
    return step


def _checking(state: PartitionState, step: Callable[_P, _R]) -> Callable[_P, _R]:
    @functools.wraps(step)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        result = step(*args, **kwargs)
        state.check_invariants()  # whatever the step returned or left
        return result

    return checked


class PartitionState:
    """The pending transactions of one half/op partition (pure: the service feeds it records).

    Args:
        partition: the half/op partition number.
        stats: the coordinator's counters (:class:`coordinator.monitoring.metrics.Stat`), read by metrics.
        half_position: next half offset to consume (from the committed offsets).
        debug: check :meth:`check_invariants` after every step (the coordinator's
            ``check_invariants`` setting); None: the class's :attr:`debug`.

    Attributes:
        pending: tx id -> transaction (read it; change it through this class).
        unsaved: what only the next commit writes: the dirty transactions, the tombstones and
            the young listing (:class:`coordinator.state.unsaved.UnsavedChanges`).
        tombstones: resolved txs whose ``<ns>_state`` entry must be deleted (``unsaved``'s set).
        payload_bytes: sizes of the half payloads currently cached in ``pending``.
    """

    #: Stale entries the check heap and FIFO may hold beyond twice the pending count before a rebuild.
    CHECK_HEAP_SLACK = 1024
    #: Check :meth:`check_invariants` after every step: the default of ``debug`` (tests set it).
    debug = False

    def __init__(
        self, partition: int, stats: Stats | None = None, half_position: int = 0, *, debug: bool | None = None
    ) -> None:
        self.partition = partition
        self.stats: Stats = stats if stats is not None else Counter()
        self.half_position = half_position
        self.pending: dict[str, PendingTx] = {}
        self.unsaved = UnsavedChanges()
        self.tombstones = self.unsaved.tombstones
        self.payload_bytes = 0
        #: Transactions whose first half was consumed here (a gone writer's may come after it went).
        self.arrivals = 0
        self._decisions = 0
        self._resolved = ResolvedMemory(RESOLVED_MEMORY)
        # Indexes (see the module docstring), kept by _adopt, _moved, _rescheduled and _resolve
        # (and `unsaved` by PendingTx.dirty).
        self._committed: dict[str, PendingTx] = {}  # phase COMMITTED
        self._awaiting_end: dict[str, PendingTx] = {}  # COMMITTED with no wait_offset yet
        self._order = CommitOrder()  # COMMITTED or READY, in decision order
        self._key_order = KeyOrder()  # the undecided transactions per message key
        self._check_queue = CheckQueue(self.pending, self.CHECK_HEAP_SLACK)  # OPEN ones, by due time
        self.debug = type(self).debug if debug is None else debug
        if self.debug:
            for name in _CHECKED_STEPS:
                self.__dict__[name] = _checking(self, getattr(self, name))

    # ------------------------------------------------------------------ input

    @_checked
    def add_restored(self, tx: PendingTx) -> None:
        """A transaction restored from ``<ns>_state`` (already persisted there)."""
        tx.persisted, tx._dirty = True, False
        self._decisions = max(self._decisions, tx.decided_seq)
        self._adopt(tx)

    @_checked
    def read_to(self, position: int) -> None:
        """The half partition is consumed up to ``position`` (exclusive).

        Every consumed record moves it, whatever it holds: a record that is quarantined or
        ignored, and (from the consumer's position) control records and aborted records too.
        A COMMIT without a count waits for this to reach its ``wait_offset``; counting only
        the half records that decoded would leave it waiting forever when the partition's
        last record is malformed.
        """
        self.half_position = max(self.half_position, position)

    @_checked
    def on_half(self, msg: HalfMessage, offset: int, size: int, append_ms: int) -> PendingTx | None:
        """Record a half message. Returns its transaction, or None when it was already resolved."""
        self.half_position = max(self.half_position, offset + 1)
        if msg.tx_id in self._resolved:
            self.stats[Stat.LATE_HALVES] += 1
            if self._resolved.take_orphaned(msg.tx_id):
                # Its COMMIT was read, then the half partition's end offset read after it was
                # reached with no half: the writer sent the op before its halves were
                # acknowledged (the SDK never does; docs/wire-format.md). Not republished.
                logger.warning(
                    "tx %s of group %r: a half came after its COMMIT was given up for want of halves; "
                    "its writer must not send the op before its half records are acknowledged",
                    msg.tx_id,
                    msg.group,
                )
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
        tx._add_half(msg.seq, HalfRef(offset, size, msg.topic, msg.key, msg))
        tx.group = tx.group or msg.group
        tx.instance = tx.instance or msg.instance
        if tx.check_source is None:
            tx.check_source = msg.source
        if tx.first_append_ms is None:
            tx.first_append_ms = append_ms
            tx.check_after_s = msg.check_after_s
        if new:
            self.arrivals += 1
            self._adopt(tx, arriving=True)  # indexes it by key, payload bytes, check time
        else:
            self.payload_bytes += size
            if tx._phase in UNDECIDED:
                self._key_order.add_key(tx, msg.key)
            tx.dirty = True
        self._promote(tx)
        return tx

    @_checked
    def on_op(self, op: OpRecord) -> PendingTx | None:
        """Apply a decision from an op record (or a back-check). Returns the tx when it changed."""
        if op.tx_id in self._resolved:
            self._late_decision(op, self._resolved.decision(op.tx_id))
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

    @_checked
    def set_end_offset(self, end: int) -> None:
        """The half partition's end offset, read after every current decision arrived."""
        waiting = list(self._awaiting_end.values())
        self._awaiting_end.clear()
        for tx in waiting:
            if tx._phase is Phase.COMMITTED and tx.wait_offset is None:
                tx.wait_offset = end
                tx.dirty = True
                self._promote(tx)

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
                self._resolved.mark_orphaned(tx.tx_id)
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
        decisions arrived: a READY transaction is held while an earlier transaction sharing
        any message key with it is still undecided or incomplete, so one resolved late by a
        back-check (its local commit came first) is not overtaken by a later one of the
        same key; those that go out together are sorted by half offset.
        """
        return self._order.ready_in_order(self._key_order, self.stats)

    def open_txs(self) -> list[PendingTx]:
        """Every OPEN transaction (a scan: the service schedules checks with :meth:`due_checks`)."""
        return [t for t in self.pending.values() if t._phase is Phase.OPEN]

    @_checked
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
        return self._check_queue.due_checks(policy, now_ms, in_flight)

    @_checked
    def expedite(self, group: str, instance: str, now_ms: int) -> int:
        """Make the OPEN transactions written by ``instance`` of ``group`` and never checked due
        now (its writer is gone and another instance answers decisively): the first check's delay
        is skipped; the backoff between checks is not. Returns how many. A scan: called when a
        writer goes silent or leaves, and again while it stays gone as transactions arrive."""
        count = 0
        for tx in self.pending.values():
            if (
                tx._phase is Phase.OPEN
                and tx._halves is not None
                and tx.checks == 0
                and tx.group == group
                and tx.instance == instance
                and (tx._next_check_ms is None or tx._next_check_ms > now_ms)
            ):
                tx.next_check_ms = now_ms  # pushes a heap entry due now (a first-check entry goes stale)
                tx.dirty = True
                count += 1
        return count

    def has_work(self) -> bool:
        """Something for the next commit boundary: a tombstone, a dirty or READY tx, an end offset to
        read, a COMMIT whose wait for halves is over."""
        return bool(self.unsaved or self._order.ready or self.needs_end_offset() or self.waits_reached())

    def waits_reached(self) -> bool:
        """True when a COMMIT's ``wait_offset`` was reached: the next boundary publishes or quarantines it."""
        position = self.half_position
        return any(t.wait_offset is not None and position >= t.wait_offset for t in self._committed.values())

    def check_invariants(self) -> None:
        """Raise AssertionError when a pending transaction waits on nothing (see the module docstring).

        Costs a pass over every pending transaction: for tests and the ``check_invariants``
        setting, not for production.
        """
        scheduled = self._check_queue.scheduled_test()
        counts: Counter[Phase] = Counter()
        for tx_id, tx in self.pending.items():
            counts[tx._phase] += 1
            why = self._broken(tx_id, tx, scheduled(tx_id, tx))
            if why:
                raise AssertionError(f"partition {self.partition}: {tx!r} {why}")
        if counts[Phase.READY] != self._order.ready:
            raise AssertionError(
                f"partition {self.partition}: {self._order.ready} READY counted, not {counts}"
            )
        if counts[Phase.COMMITTED] != len(self._committed):
            raise AssertionError(f"partition {self.partition}: the COMMITTED index has stale entries")
        if self._check_queue.stray_due():
            raise AssertionError(f"partition {self.partition}: a due transaction is no longer pending")

    def _broken(self, tx_id: str, tx: PendingTx, scheduled: bool) -> str:
        """Which invariant ``tx`` breaks ("" for none); ``scheduled``: it waits in the check queue."""
        phase = tx._phase
        committed = phase is Phase.COMMITTED
        rules = [
            (tx._owner is not self or tx.tx_id != tx_id, "is not indexed under its own id"),
            (phase in TERMINAL, "is terminal but still pending"),
            (self.unsaved.is_dirty(tx_id) != tx._dirty, "has a dirty flag the dirty index does not match"),
            (phase is Phase.OPEN and tx._halves is None, "is OPEN without halves: nothing will check it"),
            (phase is Phase.OPEN and not scheduled, "is OPEN with no due time: it would never be checked"),
            (
                committed and (tx_id not in self._committed or tx_id not in self._order),
                "is COMMITTED but not in the committed indexes",
            ),
            (
                committed and tx.wait_offset is None and tx_id not in self._awaiting_end,
                "is COMMITTED with no wait_offset and no end offset coming",
            ),
            (phase is Phase.READY and tx_id not in self._order, "is READY but not in the republish queue"),
        ]
        return next((why for broken, why in rules if broken), "")

    @_checked
    def finish(self, tx: PendingTx, phase: Phase) -> None:
        """Move ``tx`` to a terminal ``phase`` and forget it (remembering its id)."""
        tx.move(phase)
        self._resolve(tx)

    @_checked
    def mark_persisted(
        self, txs: list[PendingTx], tombstoned: set[str], young: list[PendingTx] | None = None
    ) -> None:
        """After a Kafka transaction committed ``txs``' entries and listed ``young`` in its offsets."""
        for tx in txs:
            tx.dirty, tx.persisted = False, True
        still_young = [tx for tx in young or () if tx._owner is self]  # still pending here
        for tx in still_young:
            tx.dirty = False
        self.unsaved.saved(still_young, tombstoned)

    # ------------------------------------------------------------------ indexes

    def _adopt(self, tx: PendingTx, *, arriving: bool = False) -> None:
        """Make ``tx`` pending here and index it by its current fields.

        ``arriving``: its first half was just consumed (so it is the latest to arrive).
        """
        tx._owner = self
        self.pending[tx.tx_id] = tx
        self.unsaved.changed(tx)
        if tx._halves is not None:
            self.payload_bytes += tx.cached_bytes()
        phase = tx._phase
        self._order.adopt(tx)
        if phase is Phase.COMMITTED:
            self._committed[tx.tx_id] = tx
            if tx.wait_offset is None:
                self._awaiting_end[tx.tx_id] = tx
        if phase in UNDECIDED:
            self._key_order.add(tx)
        if phase is Phase.OPEN and tx._halves is not None:
            self._check_queue.add(tx, arriving=arriving)

    def _moved(self, tx: PendingTx, before: Phase) -> None:
        """``tx`` went from ``before`` to its current phase."""
        after, tx_id = tx._phase, tx.tx_id
        self._order.moved(tx, before)
        if before is Phase.COMMITTED:
            self._committed.pop(tx_id, None)
            self._awaiting_end.pop(tx_id, None)
        if after is Phase.COMMITTED:
            self._committed[tx_id] = tx
            if tx.wait_offset is None:
                self._awaiting_end[tx_id] = tx
        if before in UNDECIDED and after not in UNDECIDED:
            self._key_order.remove(tx)
        if before is Phase.OPEN:
            self._check_queue.not_due(tx_id)

    def _rescheduled(self, tx: PendingTx) -> None:
        self._check_queue.not_due(tx.tx_id)
        if tx._phase is Phase.OPEN and tx._next_check_ms is not None:
            self._check_queue.push(tx._next_check_ms, tx.tx_id)

    def _resolve(self, tx: PendingTx) -> None:
        assert tx._phase in TERMINAL, tx._phase
        tx_id = tx.tx_id
        if self.pending.pop(tx_id, None) is tx:
            self.payload_bytes -= tx.cached_bytes()
            tx._owner = None
        self._resolved.remember(tx_id, tx.decision)
        self.unsaved.forget(tx_id, tombstone=tx.persisted)
        self.stats[_RESOLVED_STAT[tx._phase]] += 1
