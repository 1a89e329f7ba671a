"""The order in which a partition's COMMITs are republished: :class:`CommitOrder`.

A part of :class:`coordinator.state.partition.PartitionState`, apart because the republish order is
a rule of its own (decision order, held per key behind an earlier undecided transaction,
sorted by half offset), tested without the rest of the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state.pending import PendingTx
from coordinator.state.phase import DECIDED_COMMIT, Phase

if TYPE_CHECKING:
    from coordinator.state.key_order import KeyOrder


class CommitOrder:
    """COMMITTED and READY transactions in decision order (``decided_seq``), and how many are READY."""

    def __init__(self) -> None:
        self._decided: dict[str, PendingTx] = {}
        self._sorted = True  # False once a restored transaction came out of decision order
        self.ready = 0

    def __contains__(self, tx_id: str) -> bool:
        return tx_id in self._decided

    def adopt(self, tx: PendingTx) -> None:
        """``tx`` became pending in its current phase."""
        if tx.phase is Phase.READY:
            self.ready += 1
        if tx.phase in DECIDED_COMMIT:
            self._add(tx)

    def moved(self, tx: PendingTx, before: Phase) -> None:
        """``tx`` went from ``before`` to its current phase."""
        after = tx.phase
        self.ready += (after is Phase.READY) - (before is Phase.READY)
        if before in DECIDED_COMMIT and after not in DECIDED_COMMIT:
            self._decided.pop(tx.tx_id, None)
        elif after in DECIDED_COMMIT and before not in DECIDED_COMMIT:
            self._add(tx)

    def ready_in_order(self, key_order: KeyOrder, stats: Stats) -> list[PendingTx]:
        """READY transactions to republish now, in per-key order (see
        :meth:`coordinator.state.partition.PartitionState.ready_in_order`)."""
        if not self.ready:
            return []
        if not self._sorted:
            self._decided = dict(sorted(self._decided.items(), key=lambda item: item[1].decided_seq))
            self._sorted = True
        out = []
        for tx in self._decided.values():
            if tx.phase is not Phase.READY:
                break
            if key_order.held_back(tx):
                stats[Stat.HELD_FOR_KEY_ORDER] += 1
                continue
            out.append(tx)
        out.sort(key=PendingTx.first_offset)
        return out

    def _add(self, tx: PendingTx) -> None:
        if self._decided and tx.decided_seq < next(reversed(self._decided.values())).decided_seq:
            self._sorted = False
        self._decided[tx.tx_id] = tx
