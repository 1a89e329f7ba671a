"""The Spark sink's driver reads ``<ns>_expired`` only once the coordinators committed their op
positions past its COMMITs (or a bound ran out): an expiry decided before a COMMIT was read is
then in the log, so the driver publishes it instead of reporting success over it."""

from __future__ import annotations

from collections.abc import Callable

from txbridge.spark.decide import wait_read_past
from txbridge.wire import Positions


def _source(*answers: dict[int, Positions]) -> Callable[[], dict[int, Positions]]:
    seen = list(answers)
    return lambda: seen.pop(0) if len(seen) > 1 else seen[0]


def test_it_waits_until_every_partition_is_read_past_its_last_commit() -> None:
    positions = _source(
        {0: Positions(10, 5), 1: Positions(10, 9)},  # partition 0 not past offset 5 yet
        {0: Positions(10, 6)},  # partition 1's record missing: still waiting for it
        {0: Positions(11, 6), 1: Positions(12, 10)},
    )
    calls = []

    def counted() -> dict[int, Positions]:
        calls.append(1)
        return positions()

    assert wait_read_past({0: 5, 1: 9}, counted, timeout=5, poll_s=0.01)
    assert len(calls) == 3


def test_a_position_never_passing_ends_the_wait_at_the_bound() -> None:
    assert not wait_read_past({0: 5}, _source({0: Positions(3, None)}), timeout=0.1, poll_s=0.01)


def test_no_commits_is_no_wait() -> None:
    assert wait_read_past({}, _source({}), timeout=0)
