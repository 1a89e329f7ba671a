"""The coordinator's watchdog: a call that outlives its timeout is reported once, with its stack."""

from __future__ import annotations

import threading
import time

from coordinator.monitoring.watchdog import Watchdog, Wedged


def _stuck_call(release: threading.Event) -> None:
    release.wait(10)


def test_a_call_that_outlives_its_timeout_is_reported_once_with_where_it_waits() -> None:
    seen: list[Wedged] = []
    dog = Watchdog(seen.append, grace_s=0.2, poll_s=0.05)
    dog.start()
    release = threading.Event()

    def worker() -> None:
        with dog.deadline("send_offsets_to_transaction", 0.1):
            _stuck_call(release)

    thread = threading.Thread(target=worker, name="loop")
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # more polls: still one report
    finally:
        release.set()
        thread.join(5)
        dog.close()
    assert len(seen) == 1
    wedged = seen[0]
    assert wedged.what == "send_offsets_to_transaction"
    assert wedged.thread == "loop"
    assert "_stuck_call" in wedged.stack
    assert wedged.overdue_s >= 0.2
    assert "send_offsets_to_transaction has not returned" in str(wedged)


def test_calls_that_return_in_time_are_never_reported() -> None:
    seen: list[Wedged] = []
    dog = Watchdog(seen.append, grace_s=0.1, poll_s=0.01)
    for _ in range(50):
        with dog.deadline("commit_transaction", 0.05):
            time.sleep(0.001)
    time.sleep(0.3)
    assert dog.check() == []
    assert seen == []


def test_each_stuck_call_is_reported_and_a_failing_callback_does_not_stop_the_watch() -> None:
    seen: list[str] = []

    def callback(wedged: Wedged) -> None:
        seen.append(wedged.what)
        raise RuntimeError("callback broke")

    dog = Watchdog(callback, grace_s=0.0, poll_s=0.01)
    with dog.deadline("first", 0.0):
        time.sleep(0.02)
        assert [w.what for w in dog.check()] == ["first"]
        with dog.deadline("second", 0.0):
            time.sleep(0.02)
            assert [w.what for w in dog.check()] == ["second"]
    assert seen == ["first", "second"]
    assert dog.check() == []
