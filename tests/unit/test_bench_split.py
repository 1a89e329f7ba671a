"""The bench's split of txbridge's commit-to-visible (txbridge_runs.latency_split): pure logic."""

from __future__ import annotations

import pytest

from bench.txbridge_runs import latency_split


def test_each_part_runs_from_one_stamp_to_the_next() -> None:
    decided = {"a": 10.000, "b": 20.000}
    appended = {"a": 10.002, "b": 20.004}
    created = {"a": 10.005, "b": 20.005}
    seen = {"a": 10.015, "b": 20.025}

    split = latency_split(decided, appended, created, seen)

    # Nearest rank: of two values, p50 is the lower and p99 the higher.
    assert split["p50 ms, decision to op appended"] == pytest.approx(2.0)
    assert split["p99 ms, decision to op appended"] == pytest.approx(4.0)
    assert split["p50 ms, op to republished"] == pytest.approx(1.0)
    assert split["p99 ms, op to republished"] == pytest.approx(3.0)
    assert split["p50 ms, republished to visible"] == pytest.approx(10.0)
    assert split["p99 ms, republished to visible"] == pytest.approx(20.0)


def test_a_transaction_missing_a_stamp_is_left_out_and_none_left_means_no_figure() -> None:
    assert latency_split({"a": 1.0}, {}, {"a": 1.1}, {"a": 1.2}) == {}
    split = latency_split({"a": 1.0, "b": 2.0}, {"a": 1.001}, {"a": 1.002, "b": 2.5}, {"a": 1.003, "b": 2.6})
    assert split["p99 ms, op to republished"] == pytest.approx(1.0)
