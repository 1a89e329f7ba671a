"""KeyOrder alone: which transactions an earlier undecided one sharing a message key holds (no broker)."""

from __future__ import annotations

from coordinator.state.key_order import KeyOrder
from coordinator.state.pending import HalfRef, PendingTx


def tx(tx_id: str, offset: int, *keys: bytes | None) -> PendingTx:
    return PendingTx(
        tx_id, 0, halves={seq: HalfRef(offset + seq, 10, "orders", key) for seq, key in enumerate(keys)}
    )


def test_a_later_one_is_held_until_the_earlier_one_of_its_key_is_removed() -> None:
    index = KeyOrder()
    late, early, other = tx("late", 30, b"k"), tx("early", 10, b"k"), tx("other", 5, b"j")
    for t in (late, early, other):
        index.add(t)
    assert index.held_back(late)
    assert not index.held_back(early)  # only earlier ones hold
    assert not index.held_back(other)
    index.remove(early)
    assert not index.held_back(late)
    index.remove(late)
    index.remove(other)
    assert len(index) == 0


def test_any_shared_key_holds_not_only_the_first() -> None:
    index = KeyOrder()
    early = tx("early", 0, b"a", b"shared")
    late = tx("late", 5, b"b", b"shared")
    unrelated = tx("unrelated", 9, b"c", b"d")
    for t in (early, late, unrelated):
        index.add(t)
    assert index.held_back(late)
    assert not index.held_back(unrelated)
    assert len(index) == 5  # a, shared, b, c, d
    index.remove(early)
    assert not index.held_back(late)
    assert len(index) == 4


def test_a_key_added_with_a_later_half_is_indexed_once_and_removed_with_the_rest() -> None:
    index = KeyOrder()
    early, late = tx("early", 0, b"a"), tx("late", 5, b"b")
    index.add(early)
    index.add(late)
    assert not index.held_back(late)
    for seq, offset in (
        (1, 6),
        (2, 7),
    ):  # two more halves of early, both of key b (as PartitionState adds them)
        early._add_half(seq, HalfRef(offset, 10, "orders", b"b"))
        index.add_key(early, b"b")
    assert index.held_back(late)
    index.remove(early)
    assert not index.held_back(late)
    assert len(index) == 1  # b: late alone


def test_keyless_and_halfless_transactions_are_not_indexed() -> None:
    index = KeyOrder()
    index.add(tx("keyless", 1, None))
    index.add(PendingTx("op-first", 0))
    index.add_key(PendingTx("op-first", 0), None)
    assert len(index) == 0
    index.remove(tx("keyless", 1, None))  # nothing to remove: no error
    assert not index.held_back(tx("keyless", 2, None))


def test_three_of_one_key_shrink_back_to_one() -> None:
    index = KeyOrder()
    txs = [tx(f"t{n}", n, b"k") for n in (7, 3, 9)]
    for t in txs:
        index.add(t)
    probe = tx("probe", 8, b"k")
    assert index.held_back(probe)
    index.remove(txs[1])
    index.remove(txs[0])
    assert not index.held_back(probe)  # only t9 is left, and it began after the probe
    assert len(index) == 1
