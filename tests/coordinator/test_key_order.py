"""Per-key order: a transaction resolved late (back-check) is not overtaken by a later one."""

from __future__ import annotations

from coordinator.state import PartitionState, Phase
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState


def half(tx: str, key: bytes) -> HalfMessage:
    return HalfMessage(tx, 0, "orders", b"v", key=key, group="g", instance="i")


def commit(tx: str, source: OpSource = OpSource.PRODUCER) -> OpRecord:
    return OpRecord(tx, TxState.COMMIT, source, 1 if source is OpSource.PRODUCER else None, "g", "i")


def publish(state: PartitionState) -> list[str]:
    out = state.ready_in_order()
    for tx in out:
        state.finish(tx, Phase.PUBLISHED)
    return [t.tx_id for t in out]


def test_a_later_same_key_commit_waits_for_the_earlier_undecided_one() -> None:
    state = PartitionState(0)
    state.on_half(half("early", b"customer-1"), 0, 10, 1000)  # its producer died after the DB commit
    state.on_half(half("late", b"customer-1"), 1, 10, 1001)
    state.on_op(commit("late"))

    assert publish(state) == []  # held: "early" is still undecided
    assert state.stats["held_for_key_order"] == 1

    state.on_op(commit("early", OpSource.CHECK))
    state.set_end_offset(2)
    assert publish(state) == ["early", "late"]


def test_other_keys_are_not_held() -> None:
    state = PartitionState(0)
    state.on_half(half("undecided", b"customer-1"), 0, 10, 1000)
    state.on_half(half("other", b"customer-2"), 1, 10, 1001)
    state.on_op(commit("other"))

    assert publish(state) == ["other"]
    assert state.pending["undecided"].phase is Phase.OPEN


def test_a_rollback_releases_the_held_transaction() -> None:
    state = PartitionState(0)
    state.on_half(half("early", b"k"), 0, 10, 1000)
    state.on_half(half("late", b"k"), 1, 10, 1001)
    state.on_op(commit("late"))
    assert publish(state) == []

    state.on_op(OpRecord("early", TxState.ROLLBACK, OpSource.CHECK, None, "g", "i"))
    assert publish(state) == ["late"]


def test_transactions_without_keys_order_by_their_own_id_and_never_block_each_other() -> None:
    state = PartitionState(0)
    state.on_half(HalfMessage("a", 0, "orders", b"v", group="g", instance="i"), 0, 10, 1000)
    state.on_half(HalfMessage("b", 0, "orders", b"v", group="g", instance="i"), 1, 10, 1001)
    state.on_op(commit("b"))
    assert publish(state) == ["b"]
