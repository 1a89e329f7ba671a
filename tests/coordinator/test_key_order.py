"""Per-key order: a transaction resolved late (back-check) is not overtaken by a later one."""

from __future__ import annotations

from coordinator.state.partition import PartitionState, Phase
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


def halves(state: PartitionState, tx: str, keys: list[bytes], offset: int) -> int:
    for seq, key in enumerate(keys):
        state.on_half(
            HalfMessage(tx, seq, "orders", b"v", key=key, group="g", instance="i"), offset, 10, 1000
        )
        offset += 1
    return offset


def test_every_key_of_a_transaction_orders_it_not_only_the_first() -> None:
    """A producer's transactions of several keys each (the Spark sink's rows of a task),
    decided by back-checks in reverse: each waits for every earlier one it shares a key with."""
    state = PartitionState(0)
    offset = halves(state, "t1", [b"k0", b"k1", b"k0"], 0)
    offset = halves(state, "t2", [b"k1", b"k0", b"k1"], offset)
    halves(state, "t3", [b"k2", b"k1"], offset)
    state.on_op(commit("t3", OpSource.CHECK))
    state.on_op(commit("t2", OpSource.CHECK))
    state.set_end_offset(8)  # a check's COMMIT has no count: complete once the end is read

    assert publish(state) == []  # t3 shares k1 with t2 and t1, t2 shares both keys with t1
    state.on_op(commit("t1", OpSource.CHECK))
    state.set_end_offset(8)
    assert publish(state) == ["t1", "t2", "t3"]


def test_a_key_that_arrives_in_a_later_half_holds_later_transactions_too() -> None:
    state = PartitionState(0)
    state.on_half(HalfMessage("early", 0, "orders", b"v", key=b"a", group="g", instance="i"), 0, 10, 1000)
    state.on_half(half("late", b"b"), 1, 10, 1001)
    state.on_op(commit("late"))
    assert publish(state) == ["late"]  # nothing of "early" has key b yet

    state.on_half(half("later", b"c"), 2, 10, 1002)
    state.on_half(HalfMessage("early", 1, "orders", b"v", key=b"c", group="g", instance="i"), 3, 10, 1003)
    state.on_op(commit("later"))
    assert publish(state) == []  # "early" began before "later" and now has its key

    state.on_op(OpRecord("early", TxState.ROLLBACK, OpSource.CHECK, None, "g", "i"))
    assert publish(state) == ["later"]
