"""The local servers' daemons as processes: started in a session of their own, found again
through a pid file, measured and stopped.

The Kafka broker, the cluster's nodes, RocketMQ's name server and proxy and the Spark master
and workers all run the same way: a JVM started in the background whose output goes to a file,
whose pid goes to a pid file so that a later ``txbridge ... stop`` (another process) finds it,
and which is stopped with SIGTERM, then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie child of this process is reaped and does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == 0


def group_alive(pgid: int) -> bool:
    """Whether the process group ``pgid`` (its leader, or any member) still runs."""
    if pid_alive(pgid):
        return True
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(pid_file: Path) -> int | None:
    """The pid written in ``pid_file`` if that process runs, else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def rss(pid: int) -> int | None:
    """The resident memory of ``pid`` in bytes, or None when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def spawn(
    command: list[str],
    out: Path,
    pid_file: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output into ``out``, its pid into ``pid_file``.

    A session of its own: a terminal's Ctrl-C does not reach the daemon, and its children (a
    Spark worker's executors) share its process group, so :func:`terminate` reaches them.
    """
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    pid_file.write_text(str(process.pid))
    return process


def terminate(pid: int, timeout: float, *, what: str, group: bool = False) -> None:
    """SIGTERM ``pid`` (its whole process group when ``group``), SIGKILL it after ``timeout``,
    and wait until it is gone. ``what`` names it in the warning of a kill."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    await_exit(pid, timeout, what=what, group=group)


def await_exit(pid: int, timeout: float, *, what: str, group: bool = False) -> None:
    """Wait up to ``timeout`` for ``pid`` (or its group) to exit, then SIGKILL it and wait."""
    is_alive = group_alive if group else pid_alive
    deadline = time.monotonic() + timeout
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not is_alive(pid):
        return
    logger.warning("%s (pid %d) did not stop in %.0fs; killing it", what, pid, timeout)
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while pid_alive(pid):
        time.sleep(0.1)
