"""The bench's floor latency on a real broker: every message it sends becomes visible and is timed."""

from __future__ import annotations

import pytest

from bench.floor import floor_latency

pytestmark = pytest.mark.integration


def test_floor_latency_times_every_message_from_commit_to_visible(kafka_bootstrap: str) -> None:
    figure = floor_latency(kafka_bootstrap, size=128, rate=100.0, duration_s=2.0)

    values = figure.values
    assert figure.name == "floor commit-to-visible"
    assert figure.messages == 200
    assert values["rate_msgs_per_s"] == 100.0
    assert 0 < values["p50_ms"] <= values["p99_ms"] <= values["max_ms"]
    assert figure.params["open_loop"] is True
