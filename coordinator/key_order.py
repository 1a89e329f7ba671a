"""Per order key, the undecided transactions that may hold a later one of that key back.

Part of :class:`coordinator.state.PartitionState`: a READY transaction is published
only when no earlier undecided transaction of its key is pending, and this index answers
that per key without scanning the pending transactions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.pending import PendingTx


class KeyOrder:
    """Order key -> the undecided transaction(s) with halves and that key.

    Keyless transactions order only against themselves and are not indexed. One
    transaction per key (the common case) is kept without a list.
    """

    def __init__(self) -> None:
        self._by_key: dict[bytes, PendingTx | list[PendingTx]] = {}

    def add(self, tx: PendingTx) -> None:
        """Index ``tx`` under the key of its first half (none when it has no keyed half)."""
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

    def remove(self, tx: PendingTx) -> None:
        """Unindex ``tx`` (before its first half changes, or once it is decided)."""
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

    def earliest_undecided(self, key: bytes) -> int | None:
        """The first half offset of the earliest undecided transaction of ``key``, None if none."""
        held = self._by_key.get(key)
        if held is None:
            return None
        if isinstance(held, list):
            return min(t.first_offset() for t in held)
        return held.first_offset()

    def __len__(self) -> int:
        """How many keys have an undecided transaction."""
        return len(self._by_key)
