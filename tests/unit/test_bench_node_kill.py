"""The nodekill step's arithmetic, and where Kafka puts a transactional id: no broker needed."""

from __future__ import annotations

import itertools
import math

import pytest

from bench import steady_load
from bench.node_kill import Kill, PathTimes, figure_values, lost_and_duplicated, stall
from servers import placement
from txbridge.wire import partition_transactional_id


def test_the_stall_is_the_worst_commit_to_visible_of_what_committed_in_the_window() -> None:
    committed = {"early": 9.0, "a": 10.0, "b": 11.0, "c": 12.5, "later": 20.0}
    seen = {"early": 19.0, "a": 10.2, "b": 15.0, "c": 13.0, "later": 20.1}

    # "early" waited 10 s but committed before the kill: not the kill's.
    assert stall(committed, seen, 10.0, 20.0, watched_until=30.0) == pytest.approx(4.0)
    assert stall(committed, seen, 10.0, math.inf, watched_until=30.0) == pytest.approx(4.0)
    assert stall(committed, seen, 20.0, math.inf, watched_until=30.0) == pytest.approx(0.1)
    assert stall(committed, seen, 30.0, math.inf, watched_until=30.0) == 0.0


def test_a_message_never_seen_stalls_until_the_reader_stopped_looking() -> None:
    committed = {"a": 10.0, "b": 11.0}
    seen = {"a": 10.5}

    assert stall(committed, seen, 10.0, math.inf, watched_until=71.0) == pytest.approx(60.0)


def test_lost_and_duplicated_count_committed_messages_only() -> None:
    copies = {"a": 1, "b": 2, "phantom": 3}

    assert lost_and_duplicated(["a", "b", "c"], copies) == (1, 1)
    assert lost_and_duplicated([], copies) == (0, 0)


def test_the_figure_has_both_stalls_their_difference_and_each_kills() -> None:
    kills = [
        Kill("leader kill", 1, at=100.0, back_s=5.0, roles={}),
        Kill("txn coordinator kill", 2, at=200.0, back_s=5.0, roles={}),
    ]
    # t1's op was acknowledged just before the kill: committed for the producer at 99.6, seen
    # once the dead node's partitions had a leader again.
    txbridge = PathTimes(
        decided={"t0": 90.0, "t1": 99.5, "t2": 201.0},
        committed={"t0": 90.0, "t1": 99.6, "t2": 201.0},
        seen={"t0": 90.1, "t1": 109.0, "t2": 203.0},
        copies={"t0": 1, "t1": 1, "t2": 2},
    )
    # n1's commit_transaction was called just before the kill and blocked until 108.
    native = PathTimes(
        decided={"n0": 90.0, "n1": 99.8, "n2": 202.0, "n3": 203.0},
        committed={"n0": 90.0, "n1": 108.0, "n2": 202.0, "n3": 203.0},
        seen={"n0": 90.1, "n1": 108.1, "n2": 202.5},
        copies={"n0": 1, "n1": 1, "n2": 1},
    )

    values = figure_values({"txbridge": txbridge, "native": native}, kills, watched_until=210.0)

    assert list(values)[:3] == ["txbridge stall s", "native stall s", "txbridge - native s"]
    # From the application's commit: t1 (99.5 -> 109.0) and n1 (99.8 -> 108.1).
    assert values["txbridge stall s"] == pytest.approx(9.5)
    assert values["native stall s"] == pytest.approx(8.3)
    assert values["txbridge - native s"] == pytest.approx(1.2)
    assert values["txbridge stall s (leader kill)"] == pytest.approx(9.5)
    assert values["native stall s (leader kill)"] == pytest.approx(8.3)  # n1 blocked in its commit
    assert values["txbridge stall s (txn coordinator kill)"] == pytest.approx(2.0)
    assert values["native stall s (txn coordinator kill)"] == pytest.approx(7.0)  # n3, never seen
    # From the commit's acknowledgement, native's blocked commit no longer counts.
    assert values["txbridge stall after ack s (leader kill)"] == pytest.approx(9.4)
    assert values["native stall after ack s (leader kill)"] == pytest.approx(0.1)
    assert values["native stall after ack s"] == pytest.approx(7.0)
    assert (values["txbridge lost"], values["txbridge duplicated"]) == (0.0, 1.0)
    assert (values["native lost"], values["native duplicated"]) == (1.0, 0.0)
    assert values["txbridge longest gap s"] == pytest.approx(203.0 - 109.0)
    assert (values["txbridge committed"], values["native committed"]) == (3.0, 4.0)


def test_a_message_committed_well_before_a_kill_is_not_its_stall() -> None:
    kills = [Kill("leader kill", 1, at=100.0, back_s=5.0, roles={})]
    slow = PathTimes(decided={"a": 95.0}, committed={"a": 95.0}, seen={"a": 105.0}, copies={"a": 1})

    values = figure_values({"txbridge": slow, "native": slow}, kills, watched_until=110.0)

    assert values["txbridge stall s"] == 0.0


def test_a_late_transaction_goes_at_once_and_the_next_keep_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(steady_load.time, "monotonic", lambda: clock[0])
    pace = steady_load.Pace(rate=10.0)

    assert pace.delay() == 0.0
    assert pace.delay() == pytest.approx(0.1)
    clock[0] = 105.0  # the transaction due at 100.1 blocked for 5 s
    assert pace.delay() == 0.0
    assert pace.delay() == pytest.approx(0.1)  # no burst to catch up the 49 missed


def test_partition_for_is_kafkas_hash_of_a_transactional_id() -> None:
    assert placement.java_string_hash("") == 0
    assert placement.java_string_hash("hello") == 99162322
    assert placement.java_string_hash("polygenelubricants") == -(2**31)  # Utils.abs maps it to 0
    assert placement.partition_for("polygenelubricants", 10) == 0
    assert placement.partition_for("hello", 10) == 2


def test_a_namespaces_transactional_ids_land_on_consecutive_partitions() -> None:
    """They differ in their last character only: the nodekill step cannot put them all on one
    transaction coordinator when the transaction log's leaders go round the nodes."""
    namespace = "__txb_nodekill_x_0"
    partitions = [placement.partition_for(partition_transactional_id(namespace, p), 50) for p in range(6)]

    steps = {(b - a) % 50 for a, b in itertools.pairwise(partitions)}
    assert steps in ({1}, {49})


def test_replica_assignments_lead_where_asked() -> None:
    assert placement.led_by(2, [1, 2, 3], 4) == [[2, 1, 3], [2, 3, 1], [2, 1, 3], [2, 3, 1]]
    assert placement.round_robin([1, 2, 3], 3) == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
