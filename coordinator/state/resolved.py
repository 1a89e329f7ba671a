"""The ids of a partition's resolved transactions, to recognise late halves and ops."""

from __future__ import annotations

from collections import deque

from txbridge.wire import TxState


class ResolvedMemory:
    """The last ``capacity`` resolved tx ids of a partition and their decision.

    Part of :class:`coordinator.state.partition.PartitionState`. The oldest id is forgotten
    first; a half or op of a forgotten id starts a new pending transaction.

    Args:
        capacity: how many ids to remember.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._decisions: dict[str, TxState | None] = {}
        self._order: deque[str] = deque()  # which to forget first
        self._orphaned: set[str] = set()  # remembered COMMITs given up with no half seen

    def __contains__(self, tx_id: object) -> bool:
        return tx_id in self._decisions

    def __len__(self) -> int:
        return len(self._decisions)

    def decision(self, tx_id: str) -> TxState | None:
        """The decision ``tx_id`` was resolved with (None for none, e.g. an orphan op).

        Raises:
            KeyError: ``tx_id`` is not remembered.
        """
        return self._decisions[tx_id]

    def remember(self, tx_id: str, decision: TxState | None) -> None:
        """``tx_id`` was resolved with ``decision``."""
        if tx_id not in self._decisions:
            self._order.append(tx_id)
        self._decisions[tx_id] = decision
        if len(self._order) > self._capacity:
            forgotten = self._order.popleft()
            del self._decisions[forgotten]
            self._orphaned.discard(forgotten)

    def mark_orphaned(self, tx_id: str) -> None:
        """``tx_id``, just remembered, was a COMMIT given up with no half seen."""
        self._orphaned.add(tx_id)

    def take_orphaned(self, tx_id: str) -> bool:
        """True the first time a half of ``tx_id``, an orphaned COMMIT, is seen."""
        if tx_id in self._orphaned:
            self._orphaned.discard(tx_id)
            return True
        return False
