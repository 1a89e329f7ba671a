"""The consumer's partition bookkeeping: what is paused, resumed and committed; no broker needed."""

from __future__ import annotations

from txbridge.consumer.partitions import PartitionBook

A = ("orders", 0)
B = ("orders", 1)
C = ("orders", 2)


def test_only_assigned_partitions_are_paused_and_only_paused_ones_resumed() -> None:
    book = PartitionBook()
    book.assign({A, B})

    pause, resume = book.pause_changes(lambda tp: tp in {A, C})

    assert (pause, resume) == ({A}, set())
    book.paused |= pause
    # A paused partition that is still wanted paused is not paused again.
    assert book.pause_changes(lambda tp: tp == A) == (set(), set())
    assert book.pause_changes(lambda tp: False) == (set(), {A})


def test_only_changed_offsets_of_assigned_partitions_are_committed() -> None:
    book = PartitionBook()
    book.assign({A, B})
    book.last_committed[A] = 10

    assert book.to_commit({A: 10, B: 5, C: 7}) == {B: 5}
    assert book.to_commit({A: 11}) == {A: 11}


def test_a_forgotten_partition_is_neither_paused_nor_committed_and_starts_afresh() -> None:
    book = PartitionBook()
    book.assign({A, B})
    book.paused.add(A)
    book.last_committed[A] = 10

    book.forget({A})

    assert book.assigned == {B}
    assert book.paused == set()
    assert book.to_commit({A: 10}) == {}
    book.assign({A})
    # Assigned again (perhaps after another member committed further): its offset is committed anew.
    assert book.to_commit({A: 10}) == {A: 10}
