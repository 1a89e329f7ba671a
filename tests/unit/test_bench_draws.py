"""The e2e and floor steps' rounds summed into one figure per side."""

from __future__ import annotations

import pytest

from bench.kafka_native import Figure
from bench.steps import MODES, _summed, settled


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


def test_the_warm_up_goes_on_until_every_sides_last_two_rounds_are_within_a_tenth() -> None:
    assert not settled({"txbridge": [6_966.0], "floor": [11_351.0]})  # one round tells nothing
    assert not settled({"txbridge": [6_966.0, 8_885.0], "floor": [11_351.0, 12_727.0]})
    assert not settled({"txbridge": [8_885.0, 10_295.0], "floor": [12_727.0, 13_004.0]})  # txbridge +16 %
    assert settled({"txbridge": [10_295.0, 10_389.0], "floor": [13_004.0, 12_000.0]})
    assert not settled({"txbridge": [10_295.0, 10_389.0], "floor": [13_004.0, 10_903.0]})  # the floor -16 %
    assert settled({"floor": [14_000.0, 14_500.0]})


def test_a_full_run_warms_up_in_rounds_for_90_s_and_until_settled_and_a_quick_one_once() -> None:
    full, quick = MODES["full"], MODES["quick"]
    assert (full.e2e_warmup, full.e2e_warmup_rounds, full.e2e_warmup_s) == (20_000, 20, 90.0)
    assert (quick.e2e_warmup_rounds, quick.e2e_warmup_s) == (1, 0.0)
