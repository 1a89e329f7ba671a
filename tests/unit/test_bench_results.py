"""The benchmark's ratios: computed from the figures present, never invented."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.kafka_native import BenchError, CpuMeter, Figure, latency_figure, percentile
from bench.results import ratios


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


def latency(name: str, p50_ms: float) -> Figure:
    return Figure(name, 100, 1.0, {"rate_msgs_per_s": 100.0, "p50_ms": p50_ms, "p99_ms": 2 * p50_ms})


def test_txbridge_latency_is_set_against_the_floor_latency_at_the_same_rate() -> None:
    figures = [latency("txbridge commit-to-visible", 40.0), latency("floor commit-to-visible", 10.0)]

    assert ratios(figures) == pytest.approx({"txbridge / floor latency p50": 4.0})


def test_the_latency_ratio_needs_both_latencies_measured() -> None:
    assert ratios([latency("txbridge commit-to-visible", 40.0)]) == {}
    assert ratios([latency("floor commit-to-visible", 10.0)]) == {}
    assert (
        ratios([latency("txbridge commit-to-visible", 40.0), latency("floor commit-to-visible", 0.0)]) == {}
    )


def test_latency_figure_takes_percentiles_of_commit_to_visible() -> None:
    committed = {f"tx{i}": 100.0 + i for i in range(100)}
    seen = {f"tx{i}": 100.0 + i + (i + 1) / 1000 for i in range(100)}  # 1..100 ms
    figure = latency_figure("x", committed, seen, expected=100, size=64, rate=50.0, duration_s=2.0)
    assert figure.messages == 100
    assert figure.values == pytest.approx(
        {"rate_msgs_per_s": 50.0, "p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0}
    )
    assert figure.params["open_loop"] is True


def test_latency_figure_refuses_a_run_where_committed_messages_never_became_visible() -> None:
    committed = {"a": 1.0, "b": 1.0, "c": 1.0}
    with pytest.raises(BenchError, match="1 of 3 committed messages never became visible"):
        latency_figure("x", committed, {"a": 1.01, "b": 1.02}, expected=3, size=64, rate=1.0, duration_s=1.0)


@pytest.mark.parametrize(
    ("n", "pct", "expected"), [(100, 99, 99), (100, 50, 50), (1000, 99, 990), (3, 50, 2)]
)
def test_percentile_is_the_nearest_rank(n: int, pct: float, expected: float) -> None:
    assert percentile([float(v) for v in range(1, n + 1)], pct) == expected


def test_cpu_meter_reports_the_cpu_a_process_spent_per_message() -> None:
    meter = CpuMeter({"bench": os.getpid()})
    meter.start()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass

    used = meter.per_message(10)

    assert set(used) == {"bench_cpu_us_per_msg"}
    # psutil reads clock ticks (10 ms): 50 ms burnt reads as at least 40 ms, give or take a float.
    assert used["bench_cpu_us_per_msg"] >= 0.03 / 10 * 1e6


def test_cpu_meter_leaves_out_a_process_it_cannot_read() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    meter = CpuMeter({"gone": gone.pid, "unknown": None})
    meter.start()

    assert meter.per_message(10) == {}


def test_txbridge_latency_is_set_against_rocketmqs_at_rocketmqs_rate_p50_and_p99() -> None:
    figures = [
        latency("txbridge commit-to-visible (RocketMQ's rate)", 6.0),
        latency("rocketmq commit-to-visible", 12.0),
        latency("txbridge commit-to-visible", 40.0),  # another rate: not this ratio's
    ]

    assert ratios(figures) == pytest.approx(
        {"txbridge / rocketmq commit-to-visible p50": 0.5, "txbridge / rocketmq commit-to-visible p99": 0.5}
    )


def test_a_kafka_transaction_after_the_decision_is_set_against_both_at_rocketmqs_rate() -> None:
    figures = [
        latency("txbridge commit-to-visible (RocketMQ's rate)", 6.0),
        latency("rocketmq commit-to-visible", 3.0),
        latency("kafka txn after decision (RocketMQ's rate)", 4.0),
    ]

    got = ratios(figures)

    assert got["kafka txn after decision / rocketmq commit-to-visible p50"] == pytest.approx(4.0 / 3.0)
    assert got["txbridge / kafka txn after decision p50"] == pytest.approx(1.5)
    # Without RocketMQ's figure only the ratio to txbridge is there.
    assert set(ratios([figures[0], figures[2]])) == {"txbridge / kafka txn after decision p50"}
