"""When each OPEN transaction of a partition is due for a back-check, without scanning them all.

Part of :class:`coordinator.state.partition.PartitionState`, which tells it when a transaction
arrives, is rescheduled or leaves OPEN; it answers :meth:`CheckQueue.due_checks` at the
cost of the due transactions rather than of every open one.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.state.phase import Phase

if TYPE_CHECKING:
    from coordinator.state.pending import PendingTx
    from coordinator.state.scheduler import CheckPolicy


@dataclass(frozen=True)
class Due:
    """What to do now: transactions to check and transactions to expire."""

    check: list[PendingTx]
    expire: list[PendingTx]


class CheckQueue:
    """The first-check FIFO, the check heap and the due set of one partition's OPEN transactions.

    Args:
        pending: the partition's pending transactions (tx id -> transaction), read to skip
            entries of decided transactions and to rebuild the queue from.
        slack: stale entries the heap and FIFO may hold beyond twice the pending count
            before a rebuild.
    """

    def __init__(self, pending: Mapping[str, PendingTx], slack: int) -> None:
        self._pending = pending
        self._slack = slack
        # First checks of new OPEN transactions without txb.check_after, in arrival order:
        # their due times (append time + check delay) follow it, so a FIFO of ids does (8 B
        # each, and no next_check_ms until due) what a heap entry would (64 B).
        self._first: deque[str] = deque()
        # (due ms, tx id): the other OPEN transactions by next_check_ms, or by first_append_ms
        # while unscheduled; stale entries are skipped when popped and dropped by compact.
        self._heap: list[tuple[int, str]] = []
        self._due: dict[str, PendingTx] = {}  # OPEN, next_check_ms reached: due until rescheduled

    def add(self, tx: PendingTx, *, arriving: bool = False) -> None:
        """Queue a newly pending OPEN transaction with halves.

        ``arriving``: its first half was just consumed (so it is the latest to arrive).
        """
        if arriving and tx._next_check_ms is None and tx.check_after_s is None:
            self._first.append(tx.tx_id)
            self._maybe_compact()
        else:
            at = tx._next_check_ms if tx._next_check_ms is not None else tx.first_append_ms or 0
            self.push(at, tx.tx_id)

    def push(self, at: int, tx_id: str) -> None:
        """Make ``tx_id`` due at ``at`` (its earlier entries go stale)."""
        heapq.heappush(self._heap, (at, tx_id))
        self._maybe_compact()

    def not_due(self, tx_id: str) -> None:
        """``tx_id`` was rescheduled or left OPEN: it is no longer due now."""
        self._due.pop(tx_id, None)

    def _maybe_compact(self) -> None:
        if len(self._heap) + len(self._first) > 2 * len(self._pending) + self._slack:
            self.compact()

    def compact(self) -> None:
        """Rebuild the check heap and FIFO from the OPEN transactions (drops entries of decided ones)."""
        entries, first = [], []
        for tx in self._pending.values():
            if tx._phase is Phase.OPEN and tx._halves is not None:
                nxt = tx._next_check_ms
                if nxt is None and tx.check_after_s is None:
                    first.append((tx.first_append_ms or 0, tx.tx_id))
                else:
                    entries.append((nxt if nxt is not None else tx.first_append_ms or 0, tx.tx_id))
        heapq.heapify(entries)
        first.sort()
        self._heap = entries
        self._first = deque(tx_id for _, tx_id in first)

    def due_checks(self, policy: CheckPolicy, now_ms: int, in_flight: set[str]) -> Due:
        """OPEN transactions whose back-check time has come (``in_flight`` ones are skipped).

        See :meth:`coordinator.state.partition.PartitionState.due_checks`.
        """
        first = self._first
        while first:
            tx = self._pending.get(first[0])
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
        while self._heap and self._heap[0][0] <= now_ms:  # not aliased: a push may compact it
            at, tx_id = heapq.heappop(self._heap)
            tx = self._pending.get(tx_id)
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
        return Due(check, expire)

    def scheduled_test(self) -> Callable[[str, PendingTx], bool]:
        """For invariant checks: a test of "``tx`` (pending as ``tx_id``) waits in this queue".

        It reads a snapshot taken now, so that testing every pending transaction costs
        one pass over the queue.
        """
        heap = set(self._heap)
        first = set(self._first)
        due = self._due

        def scheduled(tx_id: str, tx: PendingTx) -> bool:
            nxt = tx._next_check_ms
            return (
                tx_id in due
                or (nxt is not None and (nxt, tx_id) in heap)
                or (nxt is None and (tx_id in first or (tx.first_append_ms or 0, tx_id) in heap))
            )

        return scheduled

    def stray_due(self) -> bool:
        """True when a due transaction is no longer pending (an invariant check)."""
        return any(self._pending.get(tx.tx_id) is not tx for tx in self._due.values())

    def entries(self) -> int:
        """How many entries the heap and FIFO hold, stale ones included."""
        return len(self._heap) + len(self._first)
