"""What only a commit writes to ``<ns>_state`` for one partition: :class:`UnsavedChanges`.

A part of :class:`coordinator.state.partition.PartitionState`, apart so that what the next commit must
carry is kept in one place: the transactions changed since their last entry (*dirty*), the
resolved ones whose entry must be deleted (*tombstones*), and the *young* ones the last commit
listed as half offsets in its positions record instead of writing entries for them
(:func:`coordinator.commit.changelog.plan` decides which).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.state.pending import PendingTx


class UnsavedChanges:
    """The dirty transactions, the tombstones and the young listing of one partition.

    Attributes:
        tombstones: ids of resolved transactions whose ``<ns>_state`` entry must be deleted. The
            partition state shares this set (``PartitionState.tombstones``): change it in place.
    """

    def __init__(self) -> None:
        self._dirty: dict[str, PendingTx] = {}
        self._young: dict[str, PendingTx] = {}
        self.tombstones: set[str] = set()

    def __bool__(self) -> bool:
        """True while a commit has something to write: a dirty transaction, a tombstone."""
        return bool(self._dirty or self.tombstones)

    def dirty(self) -> list[PendingTx]:
        """Pending transactions whose ``<ns>_state`` entry is missing or stale."""
        return list(self._dirty.values())

    def is_dirty(self, tx_id: str) -> bool:
        return tx_id in self._dirty

    def young_candidates(self) -> list[PendingTx]:
        """What the next commit must cover: the young transactions so far, then the dirty ones."""
        young = self._young
        return [*young.values(), *(t for t in self._dirty.values() if t.tx_id not in young)]

    def changed(self, tx: PendingTx) -> None:
        """``tx``'s dirty flag was set or cleared."""
        if tx.dirty:
            self._dirty[tx.tx_id] = tx
        else:
            self._dirty.pop(tx.tx_id, None)

    def saved(self, young: Iterable[PendingTx], tombstoned: set[str]) -> None:
        """A commit wrote the entries and tombstones it planned and listed ``young`` (still pending)."""
        self._young = {tx.tx_id: tx for tx in young}
        if not self._dirty:
            self._dirty = {}  # a dict keeps its largest table until refilled: let it go
        self.tombstones -= tombstoned

    def forget(self, tx_id: str, *, tombstone: bool) -> None:
        """``tx_id`` left the pending set; ``tombstone``: its ``<ns>_state`` entry must go."""
        self._dirty.pop(tx_id, None)
        self._young.pop(tx_id, None)
        if tombstone:
            self.tombstones.add(tx_id)
