"""The owned partitions' one owner (coordinator/state/owned.py), without a broker.

On a real broker the same operations run under the rebalance tests of tests/coordinator
(test_churn.py keeps and takes back partitions, test_commit_rollback.py rewinds one).
"""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.state.owned import OwnedPartitions
from coordinator.state.partition import PartitionState
from txbridge.kafka import TopicPartition
from txbridge.wire import Topics

TOPICS = Topics("ns")


def owner(*numbers: int) -> OwnedPartitions:
    owned = OwnedPartitions(TOPICS)
    owned.install({n: PartitionState(n, Counter()) for n in numbers})
    for n in numbers:
        owned.place(TOPICS.half, n, 10)
        owned.place(TOPICS.op, n, 5)
    return owned


def both(*numbers: int) -> list[TopicPartition]:
    return [TopicPartition(t, n) for n in numbers for t in (TOPICS.half, TOPICS.op)]


def test_a_dropped_partition_loses_its_state_positions_and_work_and_the_others_keep_theirs() -> None:
    owned = owner(0, 1)
    owned.advance(TOPICS.half, 0, 11)
    owned.advance(TOPICS.half, 1, 11)
    owned.work.ready |= {0, 1}

    owned.drop(both(0))

    assert sorted(owned.states) == [1]
    assert owned.owned == frozenset({1})
    assert dict(owned.positions) == {(TOPICS.half, 1): 11, (TOPICS.op, 1): 5}
    assert (owned.work.ready, owned.work.unsaved) == ({1}, {1})
    assert owned.held() == {1}


def test_a_kept_partition_keeps_its_state_and_positions_and_is_served_again_when_given_back() -> None:
    owned = owner(0, 1)
    state = owned.states[0]
    owned.keep({0, 1}, busy={1}, producing=lambda _n: True)  # 1 has work not committed: not kept
    owned.drop(both(0, 1))

    assert owned.states == {}
    assert owned.held() == {0}
    assert owned.positions[(TOPICS.half, 0)] == 10  # what its state was committed with

    back, gone = owned.take_back([0, 2], check=True)

    assert (back, gone) == ([0], [])
    assert owned.states[0] is state
    assert owned.owned == frozenset({0})


def test_a_kept_partition_whose_position_moved_is_refused_under_the_invariant_checks() -> None:
    owned = owner(0)
    owned.keep({0}, busy=set(), producing=lambda _n: True)
    owned.drop(both(0))
    owned.place(TOPICS.half, 0, 12)

    with pytest.raises(AssertionError, match="moved from position 10 to 12"):
        owned.take_back([0], check=True)


def test_a_rewound_partition_is_not_served_until_it_is_installed_again() -> None:
    owned = owner(0, 1)
    owned.advance(TOPICS.half, 0, 11)
    owned.work.ready.add(0)

    owned.rewind([0])

    assert sorted(owned.states) == [1]
    assert owned.to_rewind() == [0]
    assert owned.held() == {0, 1}  # its producer stays: the partition is still this owner's
    assert 0 not in owned.work.unsaved | owned.work.ready

    owned.install({0: PartitionState(0, Counter())})

    assert owned.to_rewind() == []
    assert sorted(owned.states) == [0, 1]


def test_a_partition_dropped_while_waiting_for_its_rewind_is_not_rewound() -> None:
    owned = owner(0)
    owned.rewind([0])
    owned.drop(both(0))

    assert owned.to_rewind() == []
    assert owned.held() == set()
