"""The bench's cheap steps run through the registry on a real broker, each keeping its figure in order."""

from __future__ import annotations

import pytest

from bench.runner import BenchRun, Mode

pytestmark = pytest.mark.integration

TINY = Mode(raw_count=2_000, native_s=1.0, e2e_count=100, e2e_warmup=20, latency_s=1.0, checks=10, pending=10)


def test_raw_native_and_floor_latency_steps_by_name(kafka_bootstrap: str) -> None:
    with BenchRun(kafka_bootstrap, TINY, size=64, concurrency=2, in_flight=8) as run:
        figures = [run.step(name) for name in ("raw", "native1", "floor_latency")]

    assert run.figures == figures
    assert [f.name for f in figures] == ["raw produce", "native txn per message", "floor commit-to-visible"]
    assert figures[0].messages == 2_000
    assert figures[1].messages > 0
    assert figures[2].values["rate_msgs_per_s"] == 200.0  # half the 400/s assumed without an e2e figure


def test_txbridges_latency_step_splits_each_transaction_at_its_op_record_and_its_republished_record(
    kafka_bootstrap: str,
) -> None:
    with BenchRun(kafka_bootstrap, TINY, size=64, concurrency=2, in_flight=8) as run:
        figure = run.step("latency")

    values = figure.values
    assert figure.messages == 200  # 1 s at half the 400/s assumed without an e2e figure
    for part in ("decision to op appended", "op to republished", "republished to visible"):
        # Broker timestamps have millisecond resolution: a part can be -1 ms, never more negative.
        assert -1.0 <= values[f"p50 ms, {part}"] <= values[f"p99 ms, {part}"] <= values["max_ms"] + 1
    # The coordinator's Kafka commit lies between its produce() and the record's visibility.
    assert values["p50 ms, republished to visible"] > 0


def test_e2e_and_floor_alternate_their_rounds_and_each_step_keeps_its_own_figure(
    kafka_bootstrap: str,
) -> None:
    mode = Mode(
        raw_count=0, native_s=0, e2e_count=200, e2e_warmup=40, latency_s=0, checks=0, pending=0, e2e_draws=2
    )
    said: list[str] = []
    with BenchRun(kafka_bootstrap, mode, size=64, concurrency=2, in_flight=16) as run:
        run.selected = frozenset({"e2e", "floor"})
        run.progress = said.append
        txbridge = run.step("e2e")
        measured_for_floor = dict(run.measured)
        floor = run.step("floor")

    assert [f.name for f in run.figures] == ["txbridge end to end", "floor end to end"]
    assert measured_for_floor == {"floor": floor}  # measured in the e2e step's rounds, returned by floor's
    assert run.measured == {}
    for figure in (txbridge, floor):
        assert figure.messages == 200
        draws = figure.params["draws_msgs_per_s"]
        assert isinstance(draws, list)
        assert len(draws) == 2
        assert all(rate > 0 for rate in draws)
        assert figure.values["msgs_per_s"] == figure.messages / figure.seconds
        assert len(figure.params["warmup_msgs_per_s"]) == 1  # type: ignore[arg-type]
    assert said == [
        "warming up, round 1: 40 transactions through txbridge and floor, not counted ...",
        "round 1 of 2: 100 transactions through txbridge and floor ...",
        "round 2 of 2: 100 transactions through txbridge and floor ...",
    ]


def test_the_floor_step_alone_measures_its_own_rounds(kafka_bootstrap: str) -> None:
    mode = Mode(
        raw_count=0, native_s=0, e2e_count=100, e2e_warmup=20, latency_s=0, checks=0, pending=0, e2e_draws=2
    )
    with BenchRun(kafka_bootstrap, mode, size=64, concurrency=2, in_flight=16) as run:
        run.selected = frozenset({"floor"})
        floor = run.step("floor")

    assert [f.name for f in run.figures] == ["floor end to end"]
    assert floor.messages == 100
    assert len(floor.params["draws_msgs_per_s"]) == 2  # type: ignore[arg-type]
