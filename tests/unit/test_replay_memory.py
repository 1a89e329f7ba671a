"""The check app's replay memory, without a server: the window, the cap and what it forgets."""

from __future__ import annotations

import pytest

from txbridge.checkback import ReplayMemory
from txbridge.errors import ConfigurationError

TOLERANCE = 300


def test_a_request_is_answered_once_and_another_one_too() -> None:
    memory = ReplayMemory(TOLERANCE)
    assert memory.admit("a", 1000, now=1000) is None
    refusal = memory.admit("a", 1000, now=1001)
    assert refusal is not None
    assert "already answered" in refusal
    assert memory.admit("b", 1000, now=1001) is None
    assert len(memory) == 2


def test_a_request_is_remembered_for_as_long_as_its_signature_is_fresh() -> None:
    memory = ReplayMemory(TOLERANCE)
    assert memory.admit("a", 1000, now=1000) is None
    # Still fresh at the last second the signature check accepts it: still refused.
    assert memory.admit("a", 1000, now=1000 + TOLERANCE) is not None
    assert len(memory) == 1
    # One second later the signature is stale (401 before the memory is asked), so it is forgotten.
    assert memory.admit("b", 1301, now=1000 + TOLERANCE + 1) is None
    assert len(memory) == 1
    assert memory.floor == 1001


def test_a_request_signed_in_the_future_is_remembered_until_its_own_window_ends() -> None:
    memory = ReplayMemory(TOLERANCE)
    assert memory.admit("ahead", 1200, now=1000) is None  # a coordinator's clock 200 s ahead
    assert memory.admit("ahead", 1200, now=1450) is not None
    assert memory.admit("other", 1500, now=1501) is None
    assert len(memory) == 1


def test_the_window_does_not_reopen_when_the_clock_steps_back() -> None:
    memory = ReplayMemory(TOLERANCE)
    assert memory.admit("a", 1000, now=1000) is None
    assert memory.admit("b", 1400, now=1400) is None  # "a" is forgotten here
    # The clock steps back 200 s: a signature made at 1000 looks fresh again (200 s off),
    # but "a" may have been answered, so anything signed before the floor stays refused.
    refusal = memory.admit("a", 1000, now=1200)
    assert refusal is not None
    assert "older than this producer remembers" in refusal
    assert memory.admit("c", 1150, now=1200) is None


def test_when_full_the_oldest_second_is_forgotten_and_refused_from_then_on() -> None:
    memory = ReplayMemory(TOLERANCE, capacity=3)
    for key, signed_at in (("a", 1000), ("b", 1001), ("c", 1001)):
        assert memory.admit(key, signed_at, now=1002) is None

    assert memory.admit("d", 1002, now=1002) is None  # full: forgets "a" (t=1000)
    assert len(memory) == 3
    assert memory.floor == 1001
    refusal = memory.admit("a", 1000, now=1002)  # a replay of the forgotten "a" is still refused
    assert refusal is not None
    assert "t>=1001" in refusal
    assert memory.admit("b", 1001, now=1002) is not None  # remembered: a replay

    # A new request of the oldest remembered second, with the memory full: that whole second
    # is forgotten ("b", "c") and refused, this request included; the window shrinks, never reopens.
    assert memory.admit("e", 1001, now=1002) is not None
    assert len(memory) == 1
    for key in ("b", "c", "e"):
        assert memory.admit(key, 1001, now=1002) is not None
    assert memory.admit("f", 1002, now=1002) is None


def test_memory_stays_bounded_under_a_flood_and_new_requests_are_still_answered() -> None:
    memory = ReplayMemory(TOLERANCE, capacity=100)
    answered = 0
    for i in range(10_000):
        now = 1000 + i / 50  # 50 requests a second: 15,000 within the window
        answered += memory.admit(f"r{i}", int(now), now) is None
        assert len(memory) <= 100
    assert answered == 10_000  # forgetting the oldest second costs nothing to requests signed now
    assert memory.floor >= 1000 + 10_000 / 50 - 2  # the window shrank to the last two seconds
    assert memory.admit("r0", 1000, now=1200) is not None  # and what it forgot stays refused


def test_a_refused_request_is_not_remembered() -> None:
    memory = ReplayMemory(TOLERANCE)
    assert memory.admit("new", 1400, now=1400) is None
    assert memory.admit("old", 1000, now=1200) is not None  # before the floor (1100)
    assert len(memory) == 1


@pytest.mark.parametrize(("tolerance", "capacity"), [(0, 10), (-1, 10), (300, 0)])
def test_a_memory_that_cannot_work_is_refused(tolerance: float, capacity: int) -> None:
    with pytest.raises(ConfigurationError):
        ReplayMemory(tolerance, capacity)
