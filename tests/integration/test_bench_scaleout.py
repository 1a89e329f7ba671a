"""The bench's scale-out steps on a real broker: the same load through 1 and 2 coordinators, and a
coordinator added then one SIGTERMed under load with every committed message seen exactly once."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import scaleout
from bench.kafka_native import BenchError
from bench.runner import MODES, BenchRun
from bench.txbridge_runs import PARTITIONS

pytestmark = pytest.mark.integration


def test_scale_out_gives_one_row_per_fleet_size_with_every_message_counted(kafka_bootstrap: str) -> None:
    with BenchRun(kafka_bootstrap, MODES["quick"], size=128, concurrency=1, in_flight=32) as run:
        figures = scaleout.scale_out(
            run.env, size=128, counts=(1, 2), messages=300, in_flight=32, latency_s=1.0
        )

    assert [f.name for f in figures] == ["scale-out, 1 coordinator", "scale-out, 2 coordinators"]
    for figure, n in zip(figures, (1, 2), strict=True):
        values, params = figure.values, figure.params
        assert figure.messages == 300
        assert params["coordinators"] == n
        assert len(params["partitions"]) == n
        assert sum(params["partitions"]) == PARTITIONS
        assert values["partitions_per_instance_min"] == min(params["partitions"])
        # Every message counted visible was republished by one of the fleet, and each one worked.
        assert sum(i["republished"] for i in params["instances"]) == 300
        assert all(i["republished"] > 0 and i["cpu_s"] > 0 for i in params["instances"])
        assert 0 < values["instance_cpu_us_per_msg_min"] <= values["instance_cpu_us_per_msg_max"]
        assert values["msgs_per_s"] > 0
        assert values["instance_idle_cpu_ms_per_s"] > 0
        assert 0 < values["p50_ms"] <= values["p99_ms"] <= values["max_ms"]
    # One open-loop rate for every fleet size, so the latency rows compare.
    assert figures[0].values["latency_rate_msgs_per_s"] == figures[1].values["latency_rate_msgs_per_s"]


def test_adding_and_removing_a_coordinator_under_load_loses_and_repeats_nothing(kafka_bootstrap: str) -> None:
    with BenchRun(kafka_bootstrap, MODES["quick"], size=128, concurrency=1, in_flight=32) as run:
        figure = scaleout.add_remove(run.env, size=128, rate=50.0, phase_s=1.5)

    values, params = figure.values, figure.params
    assert figure.name == "add + remove coordinator (static membership)"
    assert values["committed"] == figure.messages > 50
    assert values["seen_once"] == values["committed"]
    # A transaction the producer saw undecided is settled by its back-check (COMMIT here).
    assert values["committed"] <= params["messages_on_topic"]
    assert params["messages_on_topic"] <= values["committed"] + params["undecided_at_producer"]
    for event in ("steady", "add", "remove"):
        assert values[f"{event}_partition_pause_s"] >= values[f"{event}_topic_pause_s"] > 0
    # The removed coordinator's partitions waited for the survivor: a pause well above the steady gaps.
    assert values["remove_partition_pause_s"] > values["steady_partition_pause_s"]
    assert params["add_to_balanced_s"] > 0
    assert params["remove_to_balanced_s"] > 0


def test_a_duplicate_or_a_lost_message_fails_the_run() -> None:
    scaleout.check_exactly_once(["a", "b"], Counter({"a": 1, "b": 1}), "ok")
    with pytest.raises(BenchError, match="1 committed transactions seen more than once"):
        scaleout.check_exactly_once(["a", "b"], Counter({"a": 2, "b": 1}), "dup")
    with pytest.raises(BenchError, match="1 never"):
        scaleout.check_exactly_once(["a", "b"], Counter({"a": 1}), "lost")


def test_a_pause_belongs_to_the_window_it_ends_in() -> None:
    times = [0.0, 0.1, 0.2, 3.0, 3.1, 3.2, 4.0]
    assert scaleout.longest_gap(times, 0.15, 3.0) == pytest.approx(2.8)
    assert scaleout.longest_gap(times, 3.05, 3.9) == pytest.approx(0.1)
    assert scaleout.longest_gap(times, 3.5, 4.0) == pytest.approx(0.8)
    assert scaleout.longest_gap(times, 5.0, 6.0) == 0.0
