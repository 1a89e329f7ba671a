"""Per message key, the undecided transactions that may hold a later one with that key back.

Part of :class:`coordinator.state.partition.PartitionState`: a READY transaction is published only
when no undecided transaction that began earlier (a lower first half offset) has a message
with any of its keys, and this index answers that without scanning the pending transactions.

Every key of a transaction counts, not only its first message's: a transaction may carry
several keys (the Spark sink puts a task's rows of many keys in each one), and indexing only
the first let a later transaction of the same producer go out before an earlier one that
shared a key further in, when back-checks decided them in reverse (a driver killed between
its decision record and its COMMITs). Since holding runs only from lower to higher first
offsets, no two transactions can hold each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.state.pending import PendingTx


class KeyOrder:
    """Message key -> the undecided transaction(s) with a half of that key.

    Keyless halves order only their own transaction and are not indexed. One transaction per
    key (the common case) is kept without a list.
    """

    def __init__(self) -> None:
        self._by_key: dict[bytes, PendingTx | list[PendingTx]] = {}

    def add(self, tx: PendingTx) -> None:
        """Index ``tx`` under every key of its halves seen so far."""
        for key in tx.message_keys():
            self.add_key(tx, key)

    def add_key(self, tx: PendingTx, key: bytes | None) -> None:
        """Index ``tx`` under ``key`` too (a new half of it has that key); no-op if it is."""
        if key is None:
            return
        held = self._by_key.get(key)
        if held is None:
            self._by_key[key] = tx
        elif held is tx:
            return
        elif isinstance(held, list):
            if not any(t is tx for t in held):
                held.append(tx)
        else:
            self._by_key[key] = [held, tx]

    def remove(self, tx: PendingTx) -> None:
        """Unindex ``tx`` (once it is decided and complete, or resolved)."""
        for key in tx.message_keys():
            held = self._by_key.get(key)
            if held is tx:
                del self._by_key[key]
            elif isinstance(held, list):
                held[:] = [t for t in held if t is not tx]
                if len(held) == 1:
                    self._by_key[key] = held[0]

    def held_back(self, tx: PendingTx) -> bool:
        """True while an undecided transaction that began before ``tx`` shares a key with it."""
        first = tx.first_offset()
        for key in tx.message_keys():
            held = self._by_key.get(key)
            if held is None:
                continue
            for other in held if isinstance(held, list) else (held,):
                if other is not tx and other.first_offset() < first:
                    return True
        return False

    def __len__(self) -> int:
        """How many keys have an undecided transaction."""
        return len(self._by_key)
