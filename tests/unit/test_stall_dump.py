"""The launcher's stall dump (servers/coordinator_process.py): SIGUSR1 only to a child that has
logged since it started. Before its first line a child may still be importing, ahead of its
SIGUSR1 handler, and SIGUSR1's default action ends it (CI on a slow box: the supervised
coordinator exited -10 before it was ready). A real child process stands in for the coordinator:
``sleep`` has no handler, so a signal sent too early shows as its death."""

import os
import signal
import subprocess
import time
from pathlib import Path

from servers.coordinator_process import CoordinatorProcess

SECRET = "test-secret"  # noqa: S105 (never used: nothing is started)


def _launcher(log: Path) -> CoordinatorProcess:
    return CoordinatorProcess(
        "127.0.0.1:1", "ns", secret=SECRET, log_path=log, supervise=True, stall_dump_s=0.5
    )


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_child_that_has_not_logged_yet_gets_no_sigusr1(tmp_path: Path) -> None:
    log = tmp_path / "coordinator.log"
    log.write_text("the previous child's lines\n")
    _age(log, 60)
    launcher = _launcher(log)
    launcher._log_offset = log.stat().st_size  # as _start records it for the new child
    child = subprocess.Popen(["sleep", "30"])
    try:
        launcher._dump_if_silent(child.pid)
        time.sleep(0.3)
        assert (child.poll(), launcher.stall_dumps) == (None, [])

        with log.open("a") as f:  # the child's first line, then silence
            f.write("starting\n")
        _age(log, 60)
        launcher._dump_if_silent(child.pid)
        assert child.wait(timeout=10) == -signal.SIGUSR1  # sent: sleep has no handler for it
        assert len(launcher.stall_dumps) == 1
    finally:
        child.kill()
        child.wait()
