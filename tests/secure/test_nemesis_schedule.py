"""The nemesis's schedule (``tests/secure/nemesis.py``), without Kafka: a seed names one schedule,
every fault is in it, one node fault at a time; and the tally of a producer killed mid-run."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.secure.chaos import tally
from tests.secure.chaos_producer import key_of, resume_points, value_of
from tests.secure.nemesis import LANES, SESSION_TIMEOUT_S, Fault, Schedule, draw_schedule

NODES = [1, 2, 3]
SEEDS = range(200)


def _draw(seed: int, seconds: float = 180) -> Schedule:
    return draw_schedule(seed, seconds, nodes=NODES, coordinators=2, producers=2)


def test_a_seed_draws_one_schedule() -> None:
    assert _draw(7) == _draw(7)
    assert _draw(7) != _draw(8)
    assert _draw(7).replay == "TXBRIDGE_CHAOS_SEEDS=7 TXBRIDGE_CHAOS_SECONDS=180"


@pytest.mark.parametrize("seconds", [180, 600])
def test_every_fault_is_drawn_and_a_coordinator_comes_back_under_its_own_id_and_a_new_one(
    seconds: float,
) -> None:
    for seed in SEEDS:
        schedule = _draw(seed, seconds)
        restarts = [s for s in schedule.steps if s.fault in (Fault.COORDINATOR_KILL, Fault.COORDINATOR_TERM)]

        assert {s.fault for s in schedule.steps} == set(Fault), seed
        assert {s.renamed for s in restarts} == {True, False}, seed


def test_node_faults_never_overlap_and_steps_stay_within_the_run() -> None:
    for seed in SEEDS:
        schedule = _draw(seed, 600)
        for lane in LANES:
            steps = schedule.lane(lane)
            assert all(a.until <= b.at for a, b in itertools.pairwise(steps)), (seed, lane)
        assert all(s.at > 0 and s.until <= schedule.seconds for s in schedule.steps), seed


def test_coordinator_faults_mostly_meet_a_node_outage() -> None:
    def meets(schedule: Schedule) -> bool:
        outages = [(s.at, s.at + s.hold + 10) for s in schedule.lane("node")]
        return any(a <= c.at <= b for c in schedule.lane("coordinator") for a, b in outages)

    assert sum(meets(_draw(seed)) for seed in SEEDS) > 0.8 * len(SEEDS)


def test_targets_holds_and_pauses_are_in_range() -> None:
    for seed in SEEDS:
        for step in _draw(seed).steps:
            match step.fault.lane:
                case "node":
                    assert step.target in NODES
                case _:
                    assert step.target in (0, 1)
            assert step.hold > 0
            if step.fault is Fault.COORDINATOR_PAUSE:
                assert step.hold > SESSION_TIMEOUT_S, (
                    "a pause shorter than the session timeout fences nothing"
                )
            assert not step.renamed or step.fault in (Fault.COORDINATOR_KILL, Fault.COORDINATOR_TERM)


def test_a_run_too_short_for_every_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="too short for every fault"):
        _draw(1, seconds=60)


def test_more_seconds_draw_more_faults() -> None:
    assert sum(_draw(3, 600).counts().values()) > sum(_draw(3, 180).counts().values())


# ------------------------------------------------------------------ a producer killed mid-run


def _line(seq: int, tx: str, state: str) -> dict[str, Any]:
    return {"index": 0, "thread": 0, "seq": seq, "key": key_of(0, 0, seq), "messages": 1,
            "tx": tx, "state": state, "op_ack": True}  # fmt: skip


def _begun(seq: int, tx: str) -> dict[str, Any]:
    return {"index": 0, "begun": {"thread": 0, "seq": seq, "tx": tx, "messages": 1}}


def test_the_barrier_decides_what_a_killed_producer_left_in_doubt() -> None:
    # seq 0 finished; seq 1 and 2 were begun when the producer was killed: the barrier holds seq 1
    # committed (its local commit happened), seq 2 rolled back (the check came first).
    records = [_begun(0, "a"), _line(0, "a", "COMMIT"), _begun(1, "b"), _begun(2, "c")]
    barriers = {0: {"a": "committed", "b": "committed", "c": "rolled_back"}}
    a, b, c = (value_of(0, 0, seq, 0).encode() for seq in range(3))

    delivered = tally(records, barriers, [a, b])
    missing_b = tally(records, barriers, [a])
    published_c = tally(records, barriers, [a, b, c])

    assert (delivered.transactions, delivered.in_doubt, delivered.in_doubt_committed) == (1, 2, 1)
    assert (delivered.lost, delivered.duplicates, delivered.phantom) == (0, 0, 0)
    assert (missing_b.lost, published_c.phantom) == (1, 1)


def test_a_restarted_producer_goes_on_after_the_last_seq_on_record(tmp_path: Any) -> None:
    out = tmp_path / "p0.jsonl"
    out.write_text(
        '{"begun":{"thread":0,"seq":4,"tx":"x","messages":1}}\n'
        '{"thread":1,"seq":2,"state":"COMMIT"}\n'
        '{"thread":1,"se'  # cut by the SIGKILL
    )

    assert resume_points(out, threads=3) == [5, 3, 0]
    assert resume_points(tmp_path / "absent.jsonl", threads=2) == [0, 0]
