"""The pending-transaction state machine, without a broker."""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.state.partition import TRANSITIONS, PartitionState, PendingTx, Phase
from txbridge.errors import TransactionStateError
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState


def half(tx: str, seq: int, *, topic: str = "orders", key: bytes | None = b"k") -> HalfMessage:
    return HalfMessage(tx, seq, topic, f"{tx}-{seq}".encode(), key=key, group="g", instance="i")


def op(tx: str, state: TxState, count: int | None = None, source: OpSource = OpSource.PRODUCER) -> OpRecord:
    return OpRecord(tx, state, source, count, "g", "i")


def test_every_phase_has_a_row_and_terminal_phases_go_nowhere() -> None:
    assert set(TRANSITIONS) == set(Phase)
    tx = PendingTx("t", 0)
    tx.move(Phase.ROLLED_BACK)
    with pytest.raises(TransactionStateError):
        tx.move(Phase.READY)


def test_commit_with_count_is_ready_once_every_half_is_seen() -> None:
    state = PartitionState(0)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.on_op(op("a", TxState.COMMIT, count=2))
    assert state.pending["a"].phase is Phase.COMMITTED
    assert state.ready_in_order() == []
    state.on_half(half("a", 1), 1, 10, 1001)
    assert [t.tx_id for t in state.ready_in_order()] == ["a"]


def test_op_before_its_halves_waits_for_them() -> None:
    state = PartitionState(0)
    state.on_op(op("a", TxState.COMMIT, count=1))
    assert state.pending["a"].phase is Phase.COMMITTED
    state.on_half(half("a", 0), 5, 10, 1000)
    assert state.pending["a"].phase is Phase.READY


def test_first_decision_is_final_and_a_conflict_is_counted() -> None:
    stats: Counter[str] = Counter()
    state = PartitionState(0, stats)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.on_op(op("a", TxState.ROLLBACK, source=OpSource.CHECK))
    assert "a" not in state.pending
    assert state.on_op(op("a", TxState.COMMIT, count=1)) is None
    assert state.on_op(op("a", TxState.ROLLBACK)) is None
    assert (stats["conflicting_ops"], stats["duplicate_ops"]) == (1, 1)
    assert state.on_half(half("a", 1), 1, 10, 1000) is None
    assert stats["late_halves"] == 1


def test_a_conflict_while_still_pending_is_ignored_too() -> None:
    stats: Counter[str] = Counter()
    state = PartitionState(0, stats)
    state.on_op(op("a", TxState.COMMIT, count=2))
    state.on_op(op("a", TxState.ROLLBACK))
    assert state.pending["a"].phase is Phase.COMMITTED
    assert stats["conflicting_ops"] == 1


def test_check_commit_without_count_waits_for_the_end_offset() -> None:
    state = PartitionState(0, half_position=0)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.on_op(op("a", TxState.COMMIT, source=OpSource.CHECK))
    assert state.needs_end_offset()
    state.set_end_offset(3)  # a second half (offset 2) is still unread
    assert state.pending["a"].phase is Phase.COMMITTED
    state.on_half(half("b", 0), 1, 10, 1000)
    state.on_half(half("a", 1), 2, 10, 1000)
    assert state.settle_waits() == []
    assert state.pending["a"].phase is Phase.READY
    assert sorted(state.pending["a"].halves) == [0, 1]


def test_commit_order_is_kept_and_a_waiting_commit_blocks_later_ones() -> None:
    state = PartitionState(0)
    state.on_op(op("first", TxState.COMMIT, count=1))
    state.on_half(half("second", 0), 0, 10, 1000)
    state.on_op(op("second", TxState.COMMIT, count=1))
    assert state.ready_in_order() == []  # "first" decided earlier, its half not read yet
    state.on_half(half("first", 0), 1, 10, 1000)
    # Same key: they go out in the order their halves were written (see test_key_order.py).
    assert [t.tx_id for t in state.ready_in_order()] == ["second", "first"]


def test_decision_without_halves_past_the_end_offset_is_an_orphan() -> None:
    stats: Counter[str] = Counter()
    state = PartitionState(0, stats, half_position=10)
    state.on_op(op("gone", TxState.COMMIT, source=OpSource.CHECK))
    state.set_end_offset(10)
    assert state.settle_waits() == []
    assert "gone" not in state.pending
    assert stats["orphan_ops"] == 1


def test_a_half_after_its_commit_was_given_up_says_the_writer_broke_the_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wire contract: halves are acknowledged before the op. A writer that sends its op
    first can see its COMMIT given up (an orphan) before its half arrives: said, not hidden."""
    stats: Counter[str] = Counter()
    state = PartitionState(0, stats, half_position=10)
    state.on_op(op("early", TxState.COMMIT, count=1))
    state.set_end_offset(10)
    assert state.settle_waits() == []
    assert stats["orphan_ops"] == 1
    with caplog.at_level("WARNING", logger="coordinator.state.partition"):
        assert state.on_half(half("early", 0), 10, 5, 0) is None
    assert "must not send the op before its half records are acknowledged" in caplog.text
    assert stats["late_halves"] == 1


def test_incomplete_commit_is_reported_for_quarantine() -> None:
    state = PartitionState(0, half_position=0)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.on_op(op("a", TxState.COMMIT, count=3))
    state.set_end_offset(1)
    [resolution] = state.settle_waits()
    assert resolution.tx.tx_id == "a"
    assert "1 of 3" in resolution.reason


def test_resolving_a_persisted_tx_asks_for_a_tombstone() -> None:
    state = PartitionState(0)
    tx = state.on_half(half("a", 0), 0, 10, 1000)
    assert tx is not None
    assert state.unsaved.dirty() == [tx]
    state.mark_persisted([tx], set())
    assert state.unsaved.dirty() == []
    state.on_op(op("a", TxState.ROLLBACK))
    assert state.tombstones == {"a"}
    state.mark_persisted([], {"a"})
    assert state.tombstones == set()


@pytest.mark.parametrize("debug", [True, False])
def test_a_debug_state_checks_its_invariants_after_every_step_and_others_do_not(
    debug: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    monkeypatch.setattr(PartitionState, "check_invariants", lambda self: checked.append("after"))
    state = PartitionState(0, debug=debug)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.on_op(op("a", TxState.COMMIT, count=1))
    state.finish(state.ready_in_order()[0], Phase.PUBLISHED)
    assert checked == (["after"] * 3 if debug else [])
    assert "a" not in state.pending


def test_a_debug_state_stops_at_the_step_that_breaks_an_invariant() -> None:
    state = PartitionState(0, debug=True)
    state.on_half(half("a", 0), 0, 10, 1000)
    state.pending["b"] = PendingTx("b", 0)  # behind the indexes' back: no halves, no decision
    with pytest.raises(AssertionError):
        state.on_half(half("c", 0), 1, 10, 1000)
    # The class default (the tests' fixture sets it) makes every state a debug one.
    assert PartitionState(1).debug is True
