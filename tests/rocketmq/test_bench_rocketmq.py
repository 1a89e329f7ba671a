"""``txbridge bench``'s rocketmq step: the real RocketMQ beside txbridge, and its failures.

The step runs as a user runs it (``txbridge bench ...`` in a process of its own), against the
session's RocketMQ (``--rocketmq-endpoint``) and the test Kafka; the assertions are on what the
user reads: the printed table, the JSON and its ratios, and the one-line errors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from servers import jars
from servers.broker import free_port
from servers.rocketmq import CLUSTER_NAME
from tests.rocketmq.conftest import SessionRocketMQ
from tests.soak import soak_test

pytestmark = [pytest.mark.rocketmq, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TXBRIDGE = str(Path(sys.executable).parent / "txbridge")
IN_FLIGHT = 16


def _bench(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TXBRIDGE, "bench", "--quick", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def env(kafka_bootstrap: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TXBRIDGE_")}
    out["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    out["COLUMNS"] = "200"  # rich's table: one line per row
    return out


def _figures(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads(next(path.glob("bench-steps-quick-*.json")).read_text())  # --only: some steps
    return {f["name"]: f for f in data["figures"]}, data


# A benchmark: CI's `txbridge bench --quick` runs the same step beside its own RocketMQ.
@soak_test("5 minutes of benchmark")
def test_rocketmq_beside_txbridge_with_the_same_load_and_the_ratios(
    session: SessionRocketMQ, env: dict[str, str], tmp_path: Path
) -> None:
    rmq = session.rocketmq
    done = _bench(
        [
            *("--only", "e2e", "--only", "rocketmq", "--in-flight", str(IN_FLIGHT), "--out", str(tmp_path)),
            *("--rocketmq-endpoint", rmq.endpoint, "--rocketmq-namesrv", rmq.namesrv_addr),
        ],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Progress while it runs, then the table with the ratios.
    assert f"rocketmq: transactional sends: {IN_FLIGHT} threads" in done.stdout
    assert "rocketmq: plain sends" in done.stdout
    for row in ("rocketmq txn end to end", "rocketmq plain send", "rocketmq commit-to-visible"):
        assert row in done.stdout
    assert re.search(r"txbridge / rocketmq txn\s+│\s+\d+\.\d{3}", done.stdout), done.stdout

    figures, data = _figures(tmp_path)
    e2e, txn = figures["txbridge end to end"], figures["rocketmq txn end to end"]
    plain, latency = figures["rocketmq plain send"], figures["rocketmq commit-to-visible"]
    same_rate = figures["txbridge commit-to-visible (RocketMQ's rate)"]
    # The same load on both sides: message size and transactions in flight.
    assert txn["params"]["size"] == plain["params"]["size"] == e2e["params"]["size"] == 512
    assert txn["params"]["threads"] == e2e["params"]["concurrency"] == IN_FLIGHT
    assert txn["params"]["flush"] == "ASYNC_FLUSH"
    assert txn["params"]["counted"] == "received by a SimpleConsumer"
    # Every committed transaction reached the consumer (the step fails otherwise) and counts.
    assert txn["messages"] > 0
    assert txn["values"]["msgs_per_s"] == pytest.approx(txn["messages"] / txn["seconds"], rel=0.01)
    # Commit-to-visible on both at one rate, at most half RocketMQ's transactional rate.
    rate = latency["values"]["rate_msgs_per_s"]
    assert same_rate["values"]["rate_msgs_per_s"] == rate
    assert rate <= txn["values"]["msgs_per_s"] / 2 + 0.01
    assert latency["messages"] == int(rate * latency["seconds"])
    ratios = data["ratios"]
    assert ratios["txbridge / rocketmq txn"] == pytest.approx(
        e2e["values"]["msgs_per_s"] / txn["values"]["msgs_per_s"], rel=0.01
    )
    assert ratios["rocketmq txn / rocketmq plain send"] == pytest.approx(
        txn["values"]["msgs_per_s"] / plain["values"]["msgs_per_s"], rel=0.01
    )
    for percentile in ("p50", "p99"):
        assert ratios[f"txbridge / rocketmq commit-to-visible {percentile}"] == pytest.approx(
            same_rate["values"][f"{percentile}_ms"] / latency["values"][f"{percentile}_ms"], rel=0.01
        )
    # A Kafka transaction begun after the decision, at the same rate: what txbridge cannot shed.
    decided = figures["kafka txn after decision (RocketMQ's rate)"]
    assert decided["values"]["rate_msgs_per_s"] == rate
    assert decided["messages"] == int(rate * decided["seconds"])
    assert 0 < decided["values"]["p50_ms"] <= decided["values"]["p99_ms"]
    assert ratios["kafka txn after decision / rocketmq commit-to-visible p50"] == pytest.approx(
        decided["values"]["p50_ms"] / latency["values"]["p50_ms"], rel=0.01
    )
    assert ratios["txbridge / kafka txn after decision p50"] == pytest.approx(
        same_rate["values"]["p50_ms"] / decided["values"]["p50_ms"], rel=0.01
    )
    assert "kafka txn after decision" in done.stdout
    # What each costs per message at that rate: txbridge's coordinator and producer, the Kafka
    # transaction's producer (this process runs both producers).
    assert same_rate["values"]["coordinator_cpu_us_per_msg"] > 0
    assert same_rate["values"]["producer_cpu_us_per_msg"] > 0
    assert decided["values"]["producer_cpu_us_per_msg"] > 0
    assert data["machine"]["rocketmq"] == jars.ROCKETMQ_VERSION
    assert data["skipped"] == {}
    # On someone else's RocketMQ the bench removes the topics it made.
    topics = rmq.admin("topicList", "-n", rmq.namesrv_addr, "-c", CLUSTER_NAME)
    assert "txb-bench-" not in topics


def test_without_the_rocketmq_jars_the_step_is_skipped_with_the_reason(
    env: dict[str, str], tmp_path: Path
) -> None:
    env["TXBRIDGE_CACHE"] = str(tmp_path / "empty-cache")
    done = _bench(["--only", "rocketmq", "--out", str(tmp_path)], env, timeout=120)

    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "empty-cache" / "jars" / jars.ROCKETMQ.name
    assert f"rocketmq: skipped: the RocketMQ {jars.ROCKETMQ_VERSION} jars are not in {folder}" in " ".join(
        done.stdout.split()
    )
    assert "txbridge setup" in done.stdout
    _figures_by_name, data = _figures(tmp_path)
    assert "txbridge setup" in data["skipped"]["rocketmq"]
    assert data["figures"] == []
    # One step is not a run: the last whole run's summary is not replaced by it.
    assert not (tmp_path / "latest-quick.md").exists()


def test_a_rocketmq_that_runs_out_of_memory_is_a_one_line_error_naming_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Too little metaspace for the proxy (its embedded broker loads many classes); the name server fits.
    env["JAVA_TOOL_OPTIONS"] = "-XX:MaxMetaspaceSize=30m"
    done = _bench(["--only", "rocketmq", "--out", str(tmp_path)], env)

    assert done.returncode == 2, done.stdout + done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("error: the RocketMQ proxy ")
    assert "out of memory: " in first
    assert "java.lang.OutOfMemoryError: Metaspace" in first
    assert "Traceback" not in done.stdout + done.stderr
    # Nothing left running from the RocketMQ it started.
    home = Path(re.search(r"logs in (\S+?):?$", first).group(1)).parent  # type: ignore[union-attr]
    assert not list(home.glob("*.pid"))
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if f"-Drocketmq.home.dir={home}" in (p.info["cmdline"] or [])
    ]
    assert left == []


def test_endpoints_where_nothing_listens_are_a_one_line_error(env: dict[str, str], tmp_path: Path) -> None:
    endpoint, namesrv = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    done = _bench(
        [
            "--only",
            "rocketmq",
            "--rocketmq-endpoint",
            endpoint,
            "--rocketmq-namesrv",
            namesrv,
            "--out",
            str(tmp_path),
        ],
        env,
        timeout=120,
    )

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: nothing listens at the RocketMQ proxy (--rocketmq-endpoint) {endpoint}"
    ]
