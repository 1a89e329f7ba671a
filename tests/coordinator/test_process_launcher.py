"""The coordinator child-process launcher (``txbridge bench`` and the Spark demo use it)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servers.coordinator_process import READY_MARK, CoordinatorProcess, CoordinatorProcessError
from tests.coordinator.conftest import SECRET, Env
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import wait_for
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def launcher(env: Env, log_path: Path, *args: str) -> CoordinatorProcess:
    return CoordinatorProcess(env.bootstrap, env.namespace, secret=SECRET, log_path=log_path, args=args)


def test_a_killed_and_restarted_coordinator_publishes_again(
    env: Env, tmp_path: Path, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    log = tmp_path / "coordinator.log"
    coordinator = launcher(env, log).start()
    try:
        coordinator.wait_ready()
        first_pid = coordinator.pid
        env.producer.transaction([Msg(topic, b"before")], TxState.COMMIT)
        assert len(wait_for(env.bootstrap, topic, 1)) == 1

        coordinator.crash_and_restart(downtime=0.2)

        assert coordinator.alive()
        assert coordinator.pid != first_pid
        assert (coordinator.starts, coordinator.kills) == (2, 1)
        env.producer.transaction([Msg(topic, b"after")], TxState.COMMIT)
        assert [s.value for s in wait_for(env.bootstrap, topic, 2)] == [b"before", b"after"]
    finally:
        assert coordinator.stop() == 0, coordinator.log_tail()
    text = log.read_text()
    assert text.count(READY_MARK) >= 2  # both children appended to the one log
    assert SECRET not in text


def test_a_coordinator_that_cannot_start_fails_wait_ready_with_its_log(env: Env, tmp_path: Path) -> None:
    coordinator = launcher(env, tmp_path / "coordinator.log", "--max-checks", "0").start()
    try:
        with pytest.raises(CoordinatorProcessError, match="max_checks must be at least 1"):
            coordinator.wait_ready()
    finally:
        coordinator.stop()


def test_no_restart_after_stop(env: Env, tmp_path: Path) -> None:
    coordinator = launcher(env, tmp_path / "coordinator.log").start()
    coordinator.stop()

    coordinator.crash_and_restart(downtime=0.0)

    assert not coordinator.alive()
    assert (coordinator.starts, coordinator.kills) == (1, 0)


def test_a_supervised_coordinator_that_dies_on_its_own_is_started_again(
    env: Env, tmp_path: Path, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    coordinator = CoordinatorProcess(
        env.bootstrap, env.namespace, secret=SECRET, log_path=tmp_path / "coordinator.log", supervise=True
    ).start()
    try:
        coordinator.wait_ready()
        first_pid = coordinator.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)  # not through kill(): as the OOM killer or its watchdog's exit

        deadline = time.monotonic() + 30
        while not (coordinator.exits and coordinator.alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        coordinator.wait_ready()
        env.producer.transaction([Msg(topic, b"after")], TxState.COMMIT)

        assert [s.value for s in wait_for(env.bootstrap, topic, 1)] == [b"after"]
        assert coordinator.pid != first_pid
        assert [code for _, code, _ in coordinator.exits] == [-signal.SIGKILL]
        assert (coordinator.starts, coordinator.kills) == (2, 0)
    finally:
        assert coordinator.stop() == 0, coordinator.log_tail()


def test_what_the_launcher_ends_itself_is_not_restarted(env: Env, tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(
        env.bootstrap, env.namespace, secret=SECRET, log_path=tmp_path / "coordinator.log", supervise=True
    ).start()
    try:
        coordinator.wait_ready()
        coordinator.crash_and_restart(downtime=0.2)  # the planned kill: one restart, by the plan
        coordinator.kill()  # a standby's takeover: the killed one stays down

        time.sleep(2.0)  # the supervisor looks every 0.2 s and waits 1 s before a restart

        assert not coordinator.alive()
        assert coordinator.exits == []
        assert (coordinator.starts, coordinator.kills) == (2, 2)
    finally:
        coordinator.stop()
    assert not coordinator.alive()


def test_a_supervised_coordinator_silent_too_long_writes_its_stacks_but_not_while_paused(
    env: Env, tmp_path: Path
) -> None:
    log = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(
        env.bootstrap,
        env.namespace,
        secret=SECRET,
        log_path=log,
        args=("--log-interval", "3600"),  # an idle coordinator then logs nothing after its start
        supervise=True,
        stall_dump_s=2.0,
    ).start()
    try:
        coordinator.wait_ready()
        pid = coordinator.pause()
        assert pid is not None
        time.sleep(3.0)  # silent past stall_dump_s, but paused on purpose
        assert coordinator.stall_dumps == []
        coordinator.resume()

        deadline = time.monotonic() + 30
        while "most recent call first" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)

        assert "most recent call first" in log.read_text()  # faulthandler's stacks, after SIGUSR1
        assert len(coordinator.stall_dumps) == 1
        assert (coordinator.alive(), coordinator.pid, coordinator.exits) == (True, pid, [])
    finally:
        assert coordinator.stop() == 0, coordinator.log_tail()
