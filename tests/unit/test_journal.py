"""The positions journal's wire (txbridge/wire.py): each incarnation's positions in one
``<ns>_state`` partition, named in its owner records, and which positions a partition stands at.

tests/coordinator/test_claims.py and the coordinator tests read the same records from a real
broker; tests/unit/test_ownership_rules.py runs the journal's take-over in the model."""

from __future__ import annotations

import pytest

from txbridge.errors import WireFormatError
from txbridge.wire import (
    POSITIONS_KEY,
    OwnerRecord,
    Positions,
    current_positions,
    is_positions_key,
    journal_key,
    journal_partition,
    parse_journal_key,
)


def test_an_incarnation_keeps_one_journal_and_the_journals_spread() -> None:
    ids = [f"ns-coord-c{i}-{i:012x}" for i in range(200)]
    assert all(journal_partition(i, 12) == journal_partition(i, 12) for i in ids)
    assert all(0 <= journal_partition(i, 12) < 12 for i in ids)
    assert len({journal_partition(i, 12) for i in ids}) == 12


def test_journal_keys_name_their_owner_and_partition() -> None:
    key = journal_key("ns-coord-a-0123", 7)
    assert parse_journal_key(key) == ("ns-coord-a-0123", 7)
    assert is_positions_key(key)
    assert is_positions_key(POSITIONS_KEY)
    assert parse_journal_key(POSITIONS_KEY) is None  # the older record of <ns>_state p itself
    assert parse_journal_key(b"0190c0de-tx") is None
    assert not is_positions_key(b"0190c0de-tx")
    assert journal_key("a", 1) != journal_key("a", 11) != journal_key("a1", 1)


def test_owner_records_name_their_journal_and_older_ones_none() -> None:
    for record in (OwnerRecord("a", journal=3), OwnerRecord("a", released=True, journal=0), OwnerRecord("b")):
        assert OwnerRecord.decode(record.encode()) == record
    assert OwnerRecord.decode(b'{"owner":1,"claim":"a"}').journal is None


@pytest.mark.parametrize("journal", ["3", -1, 1.5, True])
def test_an_owner_record_naming_no_partition_is_refused(journal: object) -> None:
    value = b'{"owner":1,"claim":"a","journal":%s}' % repr(journal).lower().replace("'", '"').encode()
    with pytest.raises(WireFormatError):
        OwnerRecord.decode(value)


def test_a_partition_stands_where_its_last_owner_that_wrote_left_it() -> None:
    first, second = Positions(10, 20, ""), Positions(30, 40, "")
    journals = {("a", 5): first, ("b", 5): second, ("b", 6): Positions(1, 1, "")}
    # c claimed last and wrote nothing: it never served partition 5.
    assert current_positions([("a", 0), ("b", 2), ("c", 1)], journals, 5) == second
    assert current_positions([("b", 2), ("a", 0)], journals, 5) == first
    # An owner record from before the journal names none: the older record stands.
    older = Positions(5, 5, "")
    assert current_positions([("d", None)], journals, 5, older) == older
    assert current_positions([], journals, 5) is None
