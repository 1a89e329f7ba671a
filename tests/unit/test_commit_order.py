"""CommitOrder and UnsavedChanges alone: the republish order and what the next commit writes (no broker)."""

from __future__ import annotations

from collections import Counter

from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state.commit_order import CommitOrder
from coordinator.state.key_order import KeyOrder
from coordinator.state.pending import HalfRef, PendingTx
from coordinator.state.phase import Phase
from coordinator.state.unsaved import UnsavedChanges


def tx(tx_id: str, offset: int, key: bytes, phase: Phase, seq: int = 0) -> PendingTx:
    return PendingTx(tx_id, 0, phase, halves={0: HalfRef(offset, 10, "orders", key)}, decided_seq=seq)


def moved(order: CommitOrder, t: PendingTx, to: Phase) -> None:
    before = t.phase
    t.move(to)
    order.moved(t, before)


def test_ready_ones_go_out_in_half_offset_order_and_the_first_waiting_commit_stops_the_rest() -> None:
    order, stats = CommitOrder(), Stats()
    a, b, c = (
        tx("a", 20, b"x", Phase.COMMITTED, 1),
        tx("b", 10, b"y", Phase.COMMITTED, 2),
        tx("c", 5, b"z", Phase.COMMITTED, 3),
    )
    for t in (a, b, c):
        order.adopt(t)
    moved(order, b, Phase.READY)
    moved(order, a, Phase.READY)
    assert order.ready == 2
    assert [t.tx_id for t in order.ready_in_order(KeyOrder(), stats)] == ["b", "a"]  # by offset, c waits
    moved(order, a, Phase.PUBLISHED)
    moved(order, b, Phase.PUBLISHED)
    assert order.ready == 0
    assert "a" not in order
    assert "c" in order
    assert order.ready_in_order(KeyOrder(), stats) == []


def test_a_ready_one_is_held_behind_an_earlier_undecided_one_of_its_key_and_counted() -> None:
    order, stats, keys = CommitOrder(), Counter(), KeyOrder()
    open_one = tx("open", 1, b"k", Phase.OPEN)
    keys.add(open_one)
    late = tx("late", 2, b"k", Phase.READY, 1)
    other = tx("other", 3, b"j", Phase.READY, 2)
    order.adopt(late)
    order.adopt(other)
    assert [t.tx_id for t in order.ready_in_order(keys, stats)] == ["other"]
    assert stats[Stat.HELD_FOR_KEY_ORDER] == 1
    keys.remove(open_one)
    assert [t.tx_id for t in order.ready_in_order(keys, stats)] == ["late", "other"]


def test_a_restored_transaction_out_of_decision_order_is_sorted_into_place() -> None:
    order = CommitOrder()
    later = tx("later", 1, b"a", Phase.COMMITTED, 5)
    earlier = tx("earlier", 2, b"b", Phase.READY, 2)
    order.adopt(later)
    order.adopt(earlier)  # restored after a later decision: decision order says it comes first
    assert [t.tx_id for t in order.ready_in_order(KeyOrder(), Counter())] == ["earlier"]


def test_unsaved_changes_track_dirty_ones_tombstones_and_the_young_listing() -> None:
    unsaved = UnsavedChanges()
    assert not unsaved
    a, b = PendingTx("a", 0), PendingTx("b", 0)
    unsaved.changed(a)  # new transactions are dirty
    unsaved.changed(b)
    assert unsaved.dirty() == [a, b]
    assert unsaved
    a._dirty = False
    unsaved.changed(a)
    assert unsaved.dirty() == [b]
    assert not unsaved.is_dirty("a")
    unsaved.saved([a], set())  # the commit listed a as young
    assert unsaved.young_candidates() == [a, b]  # the young first, then the dirty
    unsaved.forget("a", tombstone=True)
    unsaved.forget("b", tombstone=False)
    assert unsaved.young_candidates() == []
    assert unsaved.tombstones == {"a"}
    assert unsaved
    shared = unsaved.tombstones
    unsaved.saved([], {"a"})
    assert shared is unsaved.tombstones  # the partition state holds the same set
    assert not unsaved
