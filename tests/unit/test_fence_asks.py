"""How a fence asks for an earlier owner's transactional id (coordinator/commit/ownership.py):
a second client asks again when the first is not answered within ``_FENCE_ASK_AGAIN_S``, and
the first answer fences the id. Fake clients here; tests/coordinator/test_claims.py and
test_ownership.py fence real open transactions on a real broker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from coordinator.commit import ownership as ownership_module
from coordinator.commit.ownership import Ownership
from txbridge.errors import KafkaOperationError


class _Asks:
    """Stands in for ``Ownership._initialised``: the n-th ask waits ``delays[n]`` seconds, then
    answers (returns a client) or fails with ``errors[n]``."""

    def __init__(self, delays: list[float], errors: list[Exception | None]) -> None:
        self.delays, self.errors = delays, errors
        self.started: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, transactional_id: str, **_settings: Any) -> object:
        with self._lock:
            n = len(self.started)
            self.started.append(time.monotonic())
        time.sleep(self.delays[n])
        error = self.errors[n]
        if error is not None:
            raise KafkaOperationError(f"initialising the transactional id {transactional_id}") from error
        return object()


def _fence(monkeypatch: pytest.MonkeyPatch, asks: _Asks) -> tuple[Exception | None, float]:
    owner = Ownership.__new__(Ownership)  # only _fence_one's own code runs
    monkeypatch.setattr(owner, "_initialised", asks, raising=False)
    monkeypatch.setattr(Ownership, "_release_clients", staticmethod(lambda clients: None))
    began = time.monotonic()
    outcome = owner._fence_one("ns-coord-dead-0123")
    return outcome, time.monotonic() - began


def test_an_answer_within_the_wait_is_the_only_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    asks = _Asks([0.01, 0.0], [None, None])

    outcome, _took = _fence(monkeypatch, asks)

    assert outcome is None
    assert len(asks.started) == 1


def test_an_ask_not_answered_in_time_is_asked_again_and_the_first_answer_fences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first client's InitProducerId was answered CONCURRENT_TRANSACTIONS: librdkafka asks
    # again 500 ms later. The second client, asked meanwhile, is answered at once.
    asks = _Asks([0.6, 0.02], [None, None])

    outcome, took = _fence(monkeypatch, asks)

    assert outcome is None
    assert len(asks.started) == 2
    assert asks.started[1] - asks.started[0] >= ownership_module._FENCE_ASK_AGAIN_S
    assert took < 0.6  # the first ask's answer was not waited for


def test_a_second_ask_that_fails_waits_for_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    asks = _Asks([0.4, 0.0], [None, RuntimeError("connection refused")])

    outcome, took = _fence(monkeypatch, asks)

    assert outcome is None
    assert took >= 0.4


def test_a_fast_failure_is_the_fence_error_without_asking_again(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = RuntimeError("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
    asks = _Asks([0.0, 0.0], [refused, None])

    outcome, _took = _fence(monkeypatch, asks)

    assert outcome is refused
    assert len(asks.started) == 1


def test_both_asks_failing_is_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = RuntimeError("timed out"), RuntimeError("timed out again")
    asks = _Asks([0.3, 0.3], [first, second])

    outcome, _took = _fence(monkeypatch, asks)

    assert outcome is second
    assert len(asks.started) == 2
