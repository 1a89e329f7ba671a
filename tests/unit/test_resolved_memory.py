"""ResolvedMemory alone: which resolved ids a partition still recognises (no broker)."""

from __future__ import annotations

import pytest

from coordinator.state.resolved import ResolvedMemory
from txbridge.wire import TxState


def test_ids_are_remembered_with_their_decision_up_to_the_capacity_oldest_forgotten_first() -> None:
    memory = ResolvedMemory(3)
    for n, decision in enumerate([TxState.COMMIT, TxState.ROLLBACK, None, TxState.COMMIT]):
        memory.remember(f"t{n}", decision)
    assert "t0" not in memory
    assert [f"t{n}" in memory for n in range(1, 4)] == [True, True, True]
    assert len(memory) == 3
    assert memory.decision("t1") is TxState.ROLLBACK
    assert memory.decision("t2") is None
    with pytest.raises(KeyError):
        memory.decision("t0")


def test_remembering_an_id_again_updates_it_without_taking_another_place() -> None:
    memory = ResolvedMemory(2)
    memory.remember("a", None)
    memory.remember("a", TxState.COMMIT)
    memory.remember("b", TxState.ROLLBACK)
    assert "a" in memory
    assert "b" in memory
    assert memory.decision("a") is TxState.COMMIT


def test_an_orphaned_commit_is_reported_once_and_forgotten_with_its_id() -> None:
    memory = ResolvedMemory(2)
    memory.remember("orphan", TxState.COMMIT)
    memory.mark_orphaned("orphan")
    assert memory.take_orphaned("orphan")
    assert not memory.take_orphaned("orphan")  # a second late half is only a late half
    memory.mark_orphaned("orphan")
    memory.remember("x", None)
    memory.remember("y", None)  # forgets "orphan"
    assert "orphan" not in memory
    assert not memory.take_orphaned("orphan")
