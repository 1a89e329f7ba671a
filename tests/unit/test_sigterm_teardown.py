"""A pytest run cut by SIGTERM (a CI or shell timeout) still stops what its session started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]

SESSION = """
import os, signal, subprocess, time
import pytest

@pytest.fixture(scope="session")
def server(tmp_path_factory):
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # as the local broker starts
    (PID_FILE).write_text(str(child.pid))
    yield child
    time.sleep(5)  # a broker or a cluster takes seconds to stop: longer than xdist's own shutdown waits
    os.kill(child.pid, signal.SIGTERM)
    child.wait(10)

def test_long(server):
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as stopped
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


# In-process, and on xdist workers as `make test` runs it (the servers are the workers').
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_sigterm_runs_the_session_teardown(tmp_path: Path, workers: list[str]) -> None:
    pid_file = tmp_path / "server.pid"
    test_file = tmp_path / "test_cut.py"
    test_file.write_text(SESSION.replace("(PID_FILE)", f"__import__('pathlib').Path({str(pid_file)!r})"))
    run = subprocess.Popen(
        [*PYTEST, *workers, str(test_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert run.poll() is None, run.communicate()[0].decode()
        assert time.monotonic() < deadline, "the session fixture never started its server"
        time.sleep(0.1)
    server = int(pid_file.read_text())
    time.sleep(0.5)  # inside the test now
    run.send_signal(signal.SIGTERM)
    # Generous: xdist's workers start their teardown late on a busy box (30 s ran out at load 23).
    output = run.communicate(timeout=120)[0].decode()
    assert run.returncode != 0, output
    assert not _alive(server), f"the session's server (pid {server}) outlived the run:\n{output}"
