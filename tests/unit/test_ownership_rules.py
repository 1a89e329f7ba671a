"""Whom a take-over fences (coordinator/commit/ownership.py), as pure rules, and the model that
checks them over random interleavings and faults (tests/unit/positions_model.py).

test_claims.py and test_ownership.py run the same rules against a real broker; this file names
the cases, and shows the model can find what the rules exclude."""

from __future__ import annotations

import pytest

from coordinator.commit.changelog import OwnerRead, live_owners
from coordinator.commit.ownership import late_owners, to_fence
from tests.unit.positions_model import simulate
from txbridge.wire import OWNER_KEY, OwnerRecord, is_owner_key, owner_key


def claim(key: bytes, offset: int, owner: str) -> OwnerRead:
    return OwnerRead(key, offset, OwnerRecord(owner))


def release(key: bytes, offset: int, owner: str) -> OwnerRead:
    return OwnerRead(key, offset, OwnerRecord(owner, released=True))


A, B, ME = owner_key("a", 1), owner_key("b", 1), owner_key("me", 1)


def test_each_claim_has_a_key_of_its_own_that_readers_know_as_an_owner_record() -> None:
    keys = {owner_key("a", 1), owner_key("a", 2), owner_key("b", 1), OWNER_KEY}
    assert len(keys) == 4
    assert all(is_owner_key(k) for k in keys)
    assert not is_owner_key(b"0190c0de-tx")
    assert not is_owner_key(None)


def test_live_owners_keeps_each_keys_last_record_and_drops_deleted_keys() -> None:
    reads = [claim(A, 1, "a"), claim(B, 2, "b"), release(A, 3, "a"), OwnerRead(B, 4, None)]
    assert live_owners(reads) == [release(A, 3, "a")]


def test_before_a_claim_every_unreleased_claim_is_fenced_not_only_the_last() -> None:
    # Two earlier owners both still claiming (a generation one of them missed): one key per claim
    # keeps both, where one key per partition kept only the last.
    live = [claim(A, 1, "a"), release(owner_key("c", 1), 2, "c"), claim(B, 3, "b"), claim(ME, 4, "me")]
    assert to_fence(live, "me") == {"a", "b"}


def test_after_the_restore_an_owner_released_after_this_claim_is_fenced() -> None:
    # b released before this owner's claim (offset 5): it let the partition go. a released after
    # it: a held the partition beside this owner, and could take it back from memory.
    reads = [claim(B, 1, "b"), release(B, 2, "b"), claim(A, 3, "a"), claim(ME, 5, "me"), release(A, 6, "a")]
    assert late_owners(reads, "me", 5, fenced=set()) == {"a"}
    assert late_owners(reads, "me", 5, fenced={"a"}) == set()


def test_after_the_restore_every_unreleased_claim_is_fenced_wherever_it_lies() -> None:
    reads = [claim(A, 1, "a"), claim(B, 2, "b"), claim(ME, 3, "me"), claim(owner_key("c", 7), 4, "c")]
    assert late_owners(reads, "me", 3, fenced={"a"}) == {"b", "c"}


def test_this_owners_own_records_are_never_fenced() -> None:
    reads = [claim(owner_key("me", 1), 1, "me"), release(owner_key("me", 1), 2, "me"), claim(ME, 9, "me")]
    assert late_owners(reads, "me", 9, fenced=set()) == set()
    assert to_fence(live_owners(reads), "me") == set()


@pytest.mark.parametrize("layout", ["claims", "journal"])
def test_the_model_finds_no_duplicate_under_the_coordinators_rules(layout: str) -> None:
    outcomes = [simulate(layout, seed) for seed in range(300)]
    assert [seed for seed, o in enumerate(outcomes) if o.duplicates or o.gaps] == []
    assert sum(o.items for o in outcomes) > 1000  # the runs publish: they are not all fenced early


def test_the_model_finds_the_duplicates_of_the_rules_main_had_before() -> None:
    """One owner key per partition, and only the last owner record fenced after the restore: two
    coordinators taking a partition at once, one of them releasing it after the other's claim
    and taking it back from memory, both publish (the model's shortest run of it is 40 steps)."""
    duplicated = [seed for seed in range(300) if simulate("before", seed).duplicates]
    assert duplicated
