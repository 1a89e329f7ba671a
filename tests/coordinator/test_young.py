"""Young transactions carried in the committed half offset's metadata instead of <ns>_state (pure)."""

from __future__ import annotations

import pytest

from coordinator.commit.changelog import Plan, plan
from coordinator.state.partition import PartitionState
from coordinator.state.scheduler import CheckPolicy
from tests.coordinator.test_state import half, op
from txbridge.errors import WireFormatError
from txbridge.wire import YOUNG_PREFIX, TxState, decode_young, encode_young

POLICY = CheckPolicy(6.0, 15, 5.0, 60.0)


def _state(*txs: str) -> PartitionState:
    state = PartitionState(0)
    for offset, tx in enumerate(txs):
        state.on_half(half(tx, 0), offset, 10, 1000)
    return state


def _commit(state: PartitionState, position: int, budget: int = 1000) -> Plan:
    """What one commit does with the partition's state: plan, then mark what was written."""
    done = plan(state, position, budget)
    state.mark_persisted(done.entries, done.tombstones, done.young)
    return done


def test_metadata_round_trips_and_other_metadata_lists_nothing() -> None:
    text = encode_young(100, [97, 42, 99])
    assert text == f"{YOUNG_PREFIX}1,3,58"
    assert decode_young(100, text) == [42, 97, 99]
    assert encode_young(100, []) == ""
    assert decode_young(100, "") == decode_young(100, None) == decode_young(100, "someone else's") == []


@pytest.mark.parametrize(
    "bad", [f"{YOUNG_PREFIX}1,x", f"{YOUNG_PREFIX}0", f"{YOUNG_PREFIX}101", YOUNG_PREFIX]
)
def test_metadata_that_does_not_parse_is_an_error(bad: str) -> None:
    with pytest.raises(WireFormatError):
        decode_young(100, bad)


def test_young_open_transactions_are_listed_and_the_rest_get_entries() -> None:
    state = _state("young", "checked", "decided", "due")
    state.pending["checked"].checks = 1
    state.on_op(op("decided", TxState.COMMIT, count=2))  # COMMITTED, waiting for a second half
    state.pending["due"].next_check_ms = 5000
    done = _commit(state, 4)
    assert [t.tx_id for t in done.young] == ["young"]
    assert sorted(t.tx_id for t in done.entries) == ["checked", "decided", "due"]
    assert decode_young(4, done.metadata) == [0]
    # Nothing changed: the next commit writes no entry and lists the young one again.
    again = _commit(state, 4)
    assert (again.entries, [t.tx_id for t in again.young], again.metadata) == ([], ["young"], done.metadata)


def test_young_transactions_alone_give_a_commit_nothing_to_do() -> None:
    state = _state("a", "b")
    assert state.has_work()
    _commit(state, 2)
    assert not state.has_work()  # an idle coordinator does not commit every interval for them


def test_a_young_transaction_needs_no_tombstone_and_leaves_the_list_when_decided() -> None:
    state = _state("a", "b")
    _commit(state, 2)
    state.on_op(op("a", TxState.ROLLBACK))
    assert "a" not in state.pending
    done = _commit(state, 2)
    assert done.tombstones == set()
    assert [t.tx_id for t in done.young] == ["b"]
    assert decode_young(2, done.metadata) == [1]


def test_a_young_transaction_that_becomes_due_moves_to_the_changelog() -> None:
    state = _state("a")
    _commit(state, 1)
    due = state.due_checks(POLICY, now_ms=1000 + 7000, in_flight=set())
    assert [t.tx_id for t in due.check] == ["a"]
    done = _commit(state, 1)
    assert [t.tx_id for t in done.entries] == ["a"]
    assert (done.young, done.metadata) == ([], "")
    state.on_op(op("a", TxState.ROLLBACK))
    assert _commit(state, 1).tombstones == {"a"}  # it has an entry now


def test_what_does_not_fit_the_budget_gets_an_entry() -> None:
    state = _state(*(f"t{i}" for i in range(50)))
    budget = len(YOUNG_PREFIX) + 20
    done = _commit(state, 50, budget)
    assert len(done.metadata) <= budget
    assert len(done.young) + len(done.entries) == 50
    assert 0 < len(done.young) < 50
    listed = set(decode_young(50, done.metadata))
    assert listed == {t.halves[0].offset for t in done.young}


def test_no_budget_or_no_position_means_entries_only() -> None:
    for budget, position in ((0, 2), (1000, None)):
        state = _state("a", "b")
        done = _commit(state, position, budget)  # type: ignore[arg-type]
        assert (done.young, done.metadata) == ([], "")
        assert len(done.entries) == 2


def test_every_half_of_a_young_transaction_is_listed() -> None:
    state = PartitionState(0)
    state.on_half(half("multi", 0), 3, 10, 1000)
    state.on_half(half("multi", 1), 7, 10, 1000)
    done = _commit(state, 9)
    assert decode_young(9, done.metadata) == [3, 7]
