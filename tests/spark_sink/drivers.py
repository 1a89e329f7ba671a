"""Helpers of the tests that run the sink's driver (``driver_job.py``) as a child process and
check what a read_committed consumer got: every row once, each key's rows in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_driver(
    *args: str, bootstrap: str, namespace: str, group: str, secret: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m tests.spark_sink.driver_job ARGS`` in a process group of its own (a SIGKILL of
    the group takes its JVM and Python workers too); ``$SINK_SECRET`` holds ``secret``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.spark_sink.driver_job",
            *args,
            *("--bootstrap", bootstrap, "--namespace", namespace, "--group", group),
        ],
        cwd=ROOT,
        env={**os.environ, "SINK_SECRET": secret, **(env or {})},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish_driver(proc: subprocess.Popen[str], timeout: float = 400.0) -> str:
    """Its output, once it exited 0 (the test fails with the output's tail otherwise)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the driver did not finish in {timeout:.0f}s:\n{out[-5000:]}")
    assert proc.returncode == 0, out[-5000:]
    return out


def kill_driver(proc: subprocess.Popen[str]) -> str:
    """SIGKILL the driver's process group; its output so far."""
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    return out


def wait_for_file(path: Path, proc: subprocess.Popen[str], what: str, timeout: float = 600.0) -> str:
    """The text of ``path`` once the driver (still running) created it."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None:
            pytest.fail(
                f"the driver exited before {what}:\n{(proc.stdout.read() if proc.stdout else '')[-5000:]}"
            )
        if time.monotonic() > deadline:
            output = kill_driver(proc)
            pytest.fail(f"the driver never reached {what} in {timeout:.0f}s:\n{output[-5000:]}")
        time.sleep(0.2)
    return path.read_text().strip()


def assert_once_in_order(
    records: Iterable[tuple[Any, bytes | None, bytes | None]], expected: set[str], *, ordered: bool = True
) -> None:
    """``records`` as ``(topic, key, value)``, values ``"<key>-<seq>"``: each expected value once,
    nothing else, and (``ordered``) each key's sequence numbers rising."""
    records = list(records)
    values = [(value or b"").decode() for _, _, value in records]
    assert len(values) == len(set(values)), "duplicates published"
    assert set(values) == expected
    if not ordered:
        return
    seqs: dict[tuple[Any, bytes | None], list[int]] = defaultdict(list)
    for topic, key, value in records:
        seqs[(topic, key)].append(int((value or b"").decode().rsplit("-", 1)[1]))
    for key, order in seqs.items():
        assert order == sorted(order), f"key {key!r} out of order"
