"""A consumer process killed with SIGKILL mid-stream and restarted loses nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.consumers.conftest import end_offsets, wait_committed
from txbridge.ordered import OrderedProducer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"key{i}" for i in range(8)]
PER_KEY = 60


def _lines(log: Path) -> list[tuple[int, str, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        run, key, seq = line.split()
        out.append((int(run), key, int(seq)))
    return out


def _wait_lines(
    log: Path,
    predicate: Callable[[list[tuple[int, str, int]]], bool],
    proc: subprocess.Popen[bytes],
    timeout: float = 90.0,
) -> list[tuple[int, str, int]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = _lines(log)
        if predicate(lines):
            return lines
        assert proc.poll() is None, f"the consumer process exited early ({proc.returncode})"
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout}s: {len(_lines(log))} lines")


def _spawn(
    bootstrap: str, group: str, topic: str, kind: str, *, log: Path, run: int
) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "tests.consumers.crash_worker",
        bootstrap,
        group,
        topic,
        kind,
        str(log),
        str(run),
    ]
    return subprocess.Popen(args, cwd=ROOT)


@pytest.mark.parametrize("kind", ["orderly", "concurrent"])
def test_sigkill_mid_stream_then_restart_loses_nothing(
    kind: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    group_factory: Callable[[], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=4)
    group = group_factory()
    with OrderedProducer(kafka_bootstrap) as producer:
        for seq in range(PER_KEY):
            for key in KEYS:
                producer.send(topic, f"{key}:{seq}".encode(), key=key.encode())
    everything = {(key, seq) for key in KEYS for seq in range(PER_KEY)}
    log = tmp_path / "processed.log"

    first = _spawn(kafka_bootstrap, group, topic, kind, log=log, run=1)
    try:
        _wait_lines(log, lambda lines: len(lines) >= len(everything) // 2, first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    killed_at = len(_lines(log))
    assert killed_at < len(everything)  # really mid-stream

    second = _spawn(kafka_bootstrap, group, topic, kind, log=log, run=2)
    try:
        _wait_lines(log, lambda lines: {(k, s) for _, k, s in lines} >= everything, second)
        assert wait_committed(kafka_bootstrap, group, topic, 4) == end_offsets(kafka_bootstrap, topic, 4)
    finally:
        second.send_signal(signal.SIGTERM)
        code = second.wait(60)
    assert code == 0  # a clean shutdown on SIGTERM

    lines = _lines(log)
    assert {(k, s) for _, k, s in lines} == everything  # at least once: nothing lost
    print(f"{kind}: killed after {killed_at}; {len(lines) - len(everything)} replayed after the restart")
    if kind == "orderly":
        _assert_per_key_order(lines)


def _assert_per_key_order(lines: list[tuple[int, str, int]]) -> None:
    """Per key and run, a consecutive run of seqs; a restart replays a suffix, never skips."""
    by_key_run: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for run, key, seq in lines:
        by_key_run[key][run].append(seq)
    for key, runs in by_key_run.items():
        first, second = runs.get(1, []), runs.get(2, [])
        for seqs in (first, second):
            if seqs:
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), key
        if first:
            assert first[0] == 0, key
        start = second[0] if second else None
        resume = (first[-1] + 1) if first else 0
        if start is not None:
            assert start <= resume, f"{key}: restarted at {start}, after {resume - 1}: skipped"
        # First-time processing order is 0, 1, 2, ... with duplicates only as the replayed suffix.
        firsts: list[int] = []
        for seq in first + second:
            if seq not in firsts:
                firsts.append(seq)
        assert firsts == list(range(PER_KEY)), key
