"""The bench's cheap steps run through the registry on a real broker, each keeping its figure in order."""

from __future__ import annotations

import pytest

from txbridge.tools.bench.runner import BenchRun, Mode

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
