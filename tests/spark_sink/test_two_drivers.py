"""Two Spark drivers on one checkpoint (a zombie and its restart): one decides the batch.

Real Spark (two driver processes, ``driver_job.py``), Kafka and coordinator; what a user sees is
read back with a plain read_committed consumer.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.spark_sink.conftest import GROUP, SECRET, SinkEnv, read_topic
from tests.spark_sink.drivers import start_driver, wait_for_file
from txbridge.spark.decide import PAUSE_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 20  # one micro-batch (the driver reads at most 25 offsets a trigger)


def _driver(sink_env: SinkEnv, *args: str, pause: str) -> subprocess.Popen[str]:
    return start_driver(
        *args,
        bootstrap=sink_env.bootstrap,
        namespace=sink_env.namespace,
        group=GROUP,
        secret=SECRET,
        env={PAUSE_ENV: pause},
    )


def _ended(proc: subprocess.Popen[str], timeout: float = 600.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the driver did not end in {timeout:.0f}s:\n{out[-5000:]}")
    return proc.returncode, out


def test_a_zombie_driver_and_its_restart_on_one_checkpoint_never_both_decide(
    sink_env: SinkEnv, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    source, out = topic_factory(2), topic_factory(3)
    producer = Producer({"bootstrap.servers": sink_env.bootstrap})
    for i in range(ROWS):
        producer.produce(source, key=f"k{i % 4}".encode(), value=f"k{i % 4}-{i}".encode())
    producer.flush(30)
    checkpoint = str(tmp_path / "checkpoint")
    args = ("stream", "--source", source, "--out", out, "--checkpoint", checkpoint)
    zombie_at, restart_at = tmp_path / "zombie", tmp_path / "restart"

    # The zombie: its tasks wrote batch 0, and its commit stalls before it reads the batch
    # (a long GC pause, a lost network). Its restart on the same checkpoint runs batch 0 again
    # and stalls just before writing its decision. Then both go on, the zombie first.
    drivers: list[subprocess.Popen[str]] = []
    try:
        drivers.append(zombie := _driver(sink_env, *args, pause=f"before-read:0:{zombie_at}"))
        wait_for_file(zombie_at, zombie, "the zombie's commit", timeout=600)
        drivers.append(restart := _driver(sink_env, *args, pause=f"before-decision:0:{restart_at}"))
        wait_for_file(restart_at, restart, "the restart's commit", timeout=600)
        Path(f"{zombie_at}.go").touch()
        zombie_code, zombie_out = _ended(zombie)
        Path(f"{restart_at}.go").touch()
        restart_code, restart_out = _ended(restart)
    finally:  # a paused driver would wait an hour
        for proc in drivers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    values = [
        (r.value() or b"").decode() for r in read_topic(sink_env.bootstrap, out, at_least=ROWS, timeout=60)
    ]
    expected = {f"k{i % 4}-{i}" for i in range(ROWS)}
    lost, duplicated = len(expected - set(values)), len(values) - len(set(values))
    assert (lost, duplicated) == (0, 0), f"{lost} of {ROWS} rows lost, {duplicated} duplicated"
    assert set(values) == expected
    assert restart_code == 0, restart_out[-3000:]
    # The zombie was fenced: its query failed, saying who decides, and it decided nothing.
    assert zombie_code != 0, zombie_out[-3000:]
    assert "took over batch 0" in zombie_out
