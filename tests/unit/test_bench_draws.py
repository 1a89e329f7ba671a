"""The e2e and floor steps' rounds summed into one figure per side."""

from __future__ import annotations

import pytest

from bench.kafka_native import Figure
from bench.steps import MODES, _summed


def _draw(messages: int, seconds: float, broker: float) -> Figure:
    values = {"msgs_per_s": messages / seconds, "mb_per_s": messages * 512 / seconds / 1e6}
    values["broker_cpu_us_per_msg"] = broker
    return Figure("txbridge end to end", messages, seconds, values, {"size": 512, "count": messages})


def test_rounds_sum_to_their_rate_over_all_their_time_and_the_mean_cpu_per_message() -> None:
    summed = _summed([_draw(30_000, 3.0, 40.0), _draw(30_000, 6.0, 60.0), _draw(30_000, 3.0, 50.0)])

    assert (summed.name, summed.messages, summed.seconds) == ("txbridge end to end", 90_000, 12.0)
    assert summed.values["msgs_per_s"] == pytest.approx(7_500.0)  # not the mean of the rates (8,333)
    assert summed.values["mb_per_s"] == pytest.approx(90_000 * 512 / 12.0 / 1e6)
    assert summed.values["broker_cpu_us_per_msg"] == pytest.approx(50.0)
    assert summed.params == {"size": 512, "count": 90_000, "draws_msgs_per_s": [10_000.0, 5_000.0, 10_000.0]}


def test_one_round_is_its_own_figure() -> None:
    draw = _draw(3_000, 1.5, 70.0)
    assert _summed([draw]) is draw


def test_the_full_run_counts_in_three_rounds_and_a_quick_one_in_one() -> None:
    assert (MODES["full"].e2e_draws, MODES["quick"].e2e_draws) == (3, 1)
    assert MODES["full"].e2e_count % MODES["full"].e2e_draws == 0
