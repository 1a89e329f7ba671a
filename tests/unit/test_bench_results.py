"""The benchmark's ratios: computed from the figures present, never invented."""

from __future__ import annotations

import pytest

from txbridge.bench.kafka_native import Figure
from txbridge.bench.results import ratios


def fig(name: str, per_s: float) -> Figure:
    return Figure(name, messages=int(per_s * 10), seconds=10.0)


def test_ratios_of_txbridge_and_the_floor_against_their_baselines() -> None:
    figures = [
        fig("raw produce", 200_000),
        fig("native txn per message", 1_000),
        fig("txbridge end to end", 5_000),
        fig("floor end to end", 20_000),
    ]
    assert ratios(figures) == pytest.approx(
        {
            "txbridge / raw produce": 0.025,
            "txbridge / native txn per message": 5.0,
            "floor / raw produce": 0.1,
            "txbridge / floor": 0.25,
        }
    )


def test_a_ratio_whose_figures_were_not_measured_is_left_out() -> None:
    assert ratios([fig("txbridge end to end", 5_000), fig("raw produce", 0)]) == {}
    assert ratios([fig("floor end to end", 10), fig("raw produce", 100)]) == {"floor / raw produce": 0.1}
