"""KeyOrder alone: the earliest undecided transaction per order key (no broker)."""

from __future__ import annotations

from coordinator.key_order import KeyOrder
from coordinator.pending import HalfRef, PendingTx


def tx(tx_id: str, offset: int, key: bytes | None) -> PendingTx:
    return PendingTx(tx_id, 0, halves={0: HalfRef(offset, 10, "orders", key)})


def test_the_earliest_first_offset_per_key_is_reported_until_it_is_removed() -> None:
    index = KeyOrder()
    late, early, other = tx("late", 30, b"k"), tx("early", 10, b"k"), tx("other", 5, b"j")
    for t in (late, early, other):
        index.add(t)
    assert index.earliest_undecided(b"k") == 10
    assert index.earliest_undecided(b"j") == 5
    assert index.earliest_undecided(b"none") is None
    index.remove(early)
    assert index.earliest_undecided(b"k") == 30
    index.remove(late)
    index.remove(other)
    assert index.earliest_undecided(b"k") is None
    assert len(index) == 0


def test_keyless_and_halfless_transactions_are_not_indexed() -> None:
    index = KeyOrder()
    index.add(tx("keyless", 1, None))
    index.add(PendingTx("op-first", 0))
    assert len(index) == 0
    index.remove(tx("keyless", 1, None))  # nothing to remove: no error
    assert index.earliest_undecided(b"keyless") is None


def test_three_of_one_key_shrink_back_to_one() -> None:
    index = KeyOrder()
    txs = [tx(f"t{n}", n, b"k") for n in (7, 3, 9)]
    for t in txs:
        index.add(t)
    assert index.earliest_undecided(b"k") == 3
    index.remove(txs[1])
    assert index.earliest_undecided(b"k") == 7
    index.remove(txs[0])
    assert index.earliest_undecided(b"k") == 9
    assert len(index) == 1
