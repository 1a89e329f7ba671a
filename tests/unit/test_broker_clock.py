"""The brokers' clock as the coordinator estimates it (coordinator/checks/broker_clock.py): pure logic,
with the local clocks replaced."""

from __future__ import annotations

import logging

import pytest

from coordinator.checks import broker_clock
from coordinator.checks.broker_clock import WINDOW_MS, BrokerClock


class Clocks:
    """The coordinator's monotonic and wall clocks, moved by hand; the brokers' is ``broker``."""

    def __init__(self, wall_ahead_ms: int) -> None:
        self.mono = 1_000_000
        self.broker = 1_700_000_000_000
        self.wall_ahead_ms = wall_ahead_ms

    def wall(self) -> int:
        return self.broker + self.wall_ahead_ms

    def advance(self, ms: int) -> None:
        self.mono += ms
        self.broker += ms


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    c = Clocks(wall_ahead_ms=30_000)
    monkeypatch.setattr(broker_clock, "_mono_ms", lambda: c.mono)
    monkeypatch.setattr(broker_clock, "_wall_ms", c.wall)
    return c


def test_without_samples_it_is_the_wall_clock(clocks: Clocks) -> None:
    clock = BrokerClock()
    clock.observe(None)  # a CreateTime record: no sample
    assert clock.now_ms() == clocks.wall()
    assert (clock.skew_ms(), clock.measured()) == (0, False)


def test_the_least_delay_of_the_window_is_the_estimate(clocks: Clocks) -> None:
    clock = BrokerClock()
    for delay in (40, 3, 250):  # each record appended `delay` ms before it is read
        clock.observe(clocks.broker - delay)
        clocks.advance(1000)
    assert clock.now_ms() == clocks.broker - 3
    assert clock.skew_ms() == 30_003
    assert clock.measured()


def test_a_backlog_does_not_move_it_but_a_clock_step_back_is_followed_after_the_window(
    clocks: Clocks,
) -> None:
    clock = BrokerClock()
    clock.observe(clocks.broker - 2)
    clocks.advance(1000)
    clock.observe(clocks.broker - 3_600_000)  # an hour-old record read now
    assert clock.now_ms() == clocks.broker - 2
    clocks.broker -= 10_000  # the brokers' clock steps back 10 s
    clock.observe(clocks.broker - 2)
    assert clock.now_ms() == clocks.broker + 10_000 - 2  # the older least sample still holds
    for _ in range(WINDOW_MS // 1000 + 10):
        clocks.advance(1000)
        clock.observe(clocks.broker - 2)
    assert clock.now_ms() == clocks.broker - 2


def test_a_clock_step_forward_is_followed_at_once(clocks: Clocks) -> None:
    clock = BrokerClock()
    clock.observe(clocks.broker - 2)
    clocks.broker += 10_000
    clock.observe(clocks.broker - 2)
    assert clock.now_ms() == clocks.broker - 2


def test_the_last_estimate_is_kept_when_samples_stop(clocks: Clocks) -> None:
    clock = BrokerClock()
    clock.observe(clocks.broker - 5)
    clocks.advance(10 * WINDOW_MS)
    assert clock.now_ms() == clocks.broker - 5
    clocks.wall_ahead_ms = 90_000  # the coordinator's wall clock steps: nothing changes
    assert clock.now_ms() == clocks.broker - 5
    assert clock.skew_ms() == 90_005


def test_a_large_skew_is_logged_once_then_rate_limited(
    clocks: Clocks, caplog: pytest.LogCaptureFixture
) -> None:
    clock = BrokerClock()
    with caplog.at_level(logging.WARNING, logger="coordinator.checks.broker_clock"):
        for _ in range(3):
            clock.observe(clocks.broker - 1)
            clocks.advance(WINDOW_MS)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "30.0s ahead of the brokers'" in warnings[0]
