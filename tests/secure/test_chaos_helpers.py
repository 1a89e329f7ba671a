"""The broker-chaos test's own logic, without Kafka: where Kafka puts an id, and the tally that
turns what a reader saw into lost / duplicated / phantom / out-of-order counts."""

from __future__ import annotations

from typing import Any

from servers.placement import java_string_hash, partition_for
from tests.secure.chaos import longest_gap, tally
from tests.secure.chaos_producer import key_of, value_of


def test_java_string_hash_matches_java() -> None:
    # What String.hashCode() returns in Java 17 for each; "polygenelubricants" is Integer.MIN_VALUE.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("coord-chaos-c1") == 966687091
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("é€") == 15587  # UTF-16 code units, not UTF-8 bytes


def test_partition_for_is_kafkas_utils_abs_modulo() -> None:
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) is 0, not negative
    assert partition_for("coord-chaos-c1", 50) == 41
    assert partition_for("hello", 50) == 22


def _record(seq: int, tx: str, state: str, messages: int = 1) -> dict[str, Any]:
    """An outcome line of thread 0 of producer 0."""
    return {"index": 0, "thread": 0, "seq": seq, "key": key_of(0, 0, seq), "messages": messages,
            "tx": tx, "state": state, "op_ack": True}  # fmt: skip


def test_tally_counts_lost_duplicated_phantom_and_reordered_messages() -> None:
    # Thread 0 of producer 0: seq 0 and 5 share key k0; seq 1 is rolled back; seq 2 has two messages.
    records = [
        _record(0, "a", "COMMIT"),
        _record(1, "b", "ROLLBACK"),
        _record(2, "c", "COMMIT", messages=2),
        _record(5, "d", "COMMIT"),
        _record(8, "e", "UNKNOWN"),  # the check settles it: the barrier decides
        {"done": 1.0, "index": 0},
    ]
    barriers = {
        0: {"a": "committed", "b": "rolled_back", "c": "committed", "d": "committed", "e": "committed"}
    }
    v = [value_of(0, 0, s, n).encode() for s, n in ((0, 0), (1, 0), (2, 0), (2, 1), (5, 0), (8, 0))]
    a, b, c0, c1, d, e = v

    clean = tally(records, barriers, [a, c0, c1, d, e])
    broken = tally(records, barriers, [d, a, a, b, c0, e])

    assert (clean.transactions, clean.committed, clean.expected_messages) == (5, 4, 5)
    assert (clean.lost, clean.duplicates, clean.phantom, clean.order_violations) == (0, 0, 0, 0)
    assert clean.sdk_against_barrier == []
    # c1 lost, a twice, b (rolled back) seen, d (seq 5) before a (seq 0) on key k0
    assert (broken.lost, broken.duplicates, broken.phantom, broken.order_violations) == (1, 1, 1, 1)


def test_tally_flags_an_sdk_answer_the_barrier_contradicts() -> None:
    records = [_record(0, "a", "COMMIT"), _record(1, "b", "ROLLBACK")]

    figures = tally(records, {0: {"a": "rolled_back", "b": "committed"}}, [])

    assert len(figures.sdk_against_barrier) == 2


def test_longest_gap_counts_from_the_last_sighting_before_the_kill() -> None:
    times = [1.0, 2.0, 2.5, 14.0, 14.1, 20.0, 40.0]

    assert longest_gap(times, start=3.0, end=21.0) == 11.5  # 2.5 -> 14.0
    assert longest_gap(times, start=30.0, end=45.0) == 20.0  # 20.0 -> 40.0
    assert longest_gap(times, start=41.0, end=50.0) == 10.0  # nothing seen since 40.0: still stalled
