"""The demo's fifth comparison: the same rows written by Spark, through its Kafka sink and txbridge's.

The rows (``OrderCreated`` events, keyed by customer, each customer's rows on one partition of
a source topic) are read by two streaming queries of one Spark driver, a child process
(:mod:`spark_pipelines.sink_job`): one writes with ``format("kafka")``, the other with
``format("txbridge")``, under the same faults (a task that fails after part of its rows and
is retried; the driver SIGKILLed mid-batch and restarted from its checkpoints). Each output
topic is then read with read_committed by the demo's SparkSession and measured against the
rows as :mod:`spark_pipelines.compare` measures the paths: lost, duplicated, and per-key
reordered rows (``order_violations``). The txbridge sink writes through the run's coordinator,
as producer group ``<run group>-spark-sink`` with the run's check secret.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from spark_pipelines import schema
from spark_pipelines.compare import PathMetrics, measure, read_events, truth_frame
from spark_pipelines.processes import PipelineError
from spark_pipelines.store import CommittedOrder
from spark_pipelines.workload import SECRET_ENV, RunConfig
from txbridge import kafka
from txbridge.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)

#: The comparison's two rows in the report, one per sink.
SINK_PATHS = {"kafka": "spark-sink/kafka", "txbridge": "spark-sink/txbridge"}
DEFAULT_ROWS = 240
#: Micro-batches the rows are read in (the faults are in batches 0 and 1).
BATCHES = 3
CUSTOMERS = 8
SOURCE_PARTITIONS = 2
OUTPUT_PARTITIONS = 3
#: Per driver run: a cold JVM, the batches, the retry; generous for a busy machine.
DRIVER_TIMEOUT_S = 420.0


def min_rows() -> int:
    """The fewest rows for which batch 0's failing task has rows beyond its failure point."""
    from spark_pipelines.sink_job import FAIL_AFTER

    return BATCHES * SOURCE_PARTITIONS * (FAIL_AFTER + 5)


def sink_rows(rows: int, run_id: str) -> list[CommittedOrder]:
    """The rows: ``rows`` orders over :data:`CUSTOMERS` customers, numbered per customer."""
    seqs: dict[str, int] = {}
    out = []
    for i in range(rows):
        customer = f"sink-customer-{i % CUSTOMERS}"
        seqs[customer] = seqs.get(customer, 0) + 1
        out.append(CommittedOrder(f"{run_id}-sink-{i}", customer, seqs[customer], 100 + i, 0))
    return out


def _write_source(
    config: RunConfig, topic: str, rows: Sequence[CommittedOrder], extra: Mapping[str, Any]
) -> None:
    """The source topic: each customer's rows in order, on one partition (one Spark task)."""
    producer = kafka.producer(config.bootstrap, kafka.settings_for("producer", extra))
    for row in rows:
        customer_index = int(row.customer_id.rsplit("-", 1)[1])
        event = schema.OrderCreated(row.order_id, row.customer_id, row.customer_seq, row.amount_cents, 0)
        producer.produce(
            topic,
            key=row.customer_id.encode(),
            value=schema.encode(event),
            partition=customer_index % SOURCE_PARTITIONS,
        )
    if producer.flush(60) != 0:
        raise PipelineError(f"the Spark sinks' source rows were not all written to {topic}")


def compare_sinks(
    spark: SparkSession,
    config: RunConfig,
    secret: str,
    *,
    rows: int = DEFAULT_ROWS,
    client: ClientConfig | None = None,
) -> tuple[list[PathMetrics], dict[tuple[str, str], list[int]], dict[str, Any]]:
    """Write ``rows`` rows through both sinks under the faults and measure what a read_committed
    consumer gets from each.

    Args:
        spark: the demo's session (reads and measures the output topics).
        config: the run: its Kafka, namespace (the coordinator serves it) and folder.
        secret: the run's check secret (the coordinator's default secret).
        rows: how many rows; at least :func:`min_rows`.
        client: the cluster's client settings.

    Returns:
        The two metrics rows (``spark-sink/kafka``, ``spark-sink/txbridge``), their (empty)
        latency samples, and the facts for the report.

    Raises:
        ConfigurationError: too few rows.
        PipelineError: the child driver failed, or did not reach its kill point in time.
    """
    if rows < min_rows():
        raise ConfigurationError(f"--spark-sink-rows {rows}: needs at least {min_rows()}")
    began = time.monotonic()
    work = Path(config.run_dir) / "spark-sink"
    work.mkdir(parents=True, exist_ok=True)
    topics = {name: f"orders-{config.run_id}-sink-{name}" for name in ("source", "kafka", "txbridge")}
    extra = client.librdkafka() if client is not None else {}
    kafka.ensure_topics(
        config.bootstrap,
        [
            kafka.TopicSpec(topics["source"], SOURCE_PARTITIONS),
            kafka.TopicSpec(topics["kafka"], OUTPUT_PARTITIONS),
            kafka.TopicSpec(topics["txbridge"], OUTPUT_PARTITIONS),
        ],
        extra=kafka.settings_for("admin", extra),
    )
    truth = sink_rows(rows, config.run_id)
    _write_source(config, topics["source"], truth, extra)
    command = _command(config, topics, work, rows, client)
    log_path = Path(config.run_dir) / "logs" / "spark-sink-driver.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        _run_killed_once(command, secret, work, log, log_path)
        _run_to_end(command, secret, log, log_path)
    _wait_visible(spark, config, topics["txbridge"], rows, client)
    metrics, samples = _measure(spark, config, topics, truth, client)
    info = _facts(work, rows, time.monotonic() - began)
    return metrics, samples, info


def _command(
    config: RunConfig, topics: Mapping[str, str], work: Path, rows: int, client: ClientConfig | None
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spark_pipelines.sink_job",
        *("--bootstrap", config.bootstrap, "--namespace", config.namespace),
        *("--group", f"{config.group}-spark-sink", "--source", topics["source"]),
        *("--kafka-topic", topics["kafka"], "--txbridge-topic", topics["txbridge"]),
        *("--work", str(work), "--max-offsets", str(-(-rows // BATCHES))),
        *(client.cli_args() if client is not None else []),
    ]


def _start(command: Sequence[str], secret: str, log: IO[str]) -> subprocess.Popen[bytes]:
    log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(command[2:4])}\n")
    log.flush()
    return subprocess.Popen(
        command,
        env={**os.environ, SECRET_ENV: secret},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM and its Python workers die with it
    )


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _run_killed_once(command: Sequence[str], secret: str, work: Path, log: IO[str], log_path: Path) -> None:
    """The first driver run, SIGKILLed with its process group once both queries stopped in batch 1."""
    from spark_pipelines.sink_job import READY

    driver = _start(command, secret, log)
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    try:
        while not (work / READY).exists():
            if driver.poll() is not None:
                raise PipelineError(
                    f"the Spark sinks' driver exited ({driver.returncode}) before its kill point; "
                    f"its log ({log_path}) ends:\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"the Spark sinks' driver did not reach its kill point in {DRIVER_TIMEOUT_S:.0f}s; "
                    f"its log: {log_path}"
                )
            time.sleep(0.2)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    log.write(f"--- SIGKILLed the driver (process group {driver.pid}) mid-batch\n")


def _run_to_end(command: Sequence[str], secret: str, log: IO[str], log_path: Path) -> None:
    """The restarted driver: the same checkpoints, run until every row is written."""
    driver = _start(command, secret, log)
    try:
        code = driver.wait(DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PipelineError(
            f"the restarted Spark sinks' driver did not finish in {DRIVER_TIMEOUT_S:.0f}s; "
            f"its log: {log_path}"
        ) from None
    finally:
        if driver.poll() is None:  # a timeout, or the demo stopped (Ctrl-C, SIGTERM)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    if code != 0:
        raise PipelineError(
            f"the restarted Spark sinks' driver failed ({code}); "
            f"its log ({log_path}) ends:\n{_tail(log_path)}"
        )


def _wait_visible(
    spark: SparkSession, config: RunConfig, topic: str, rows: int, client: ClientConfig | None
) -> None:
    """Wait (up to 60 s) until the coordinator has published every row the txbridge sink committed:
    its COMMIT ops are written when the driver's query ends, the republishing follows."""
    from pyspark.sql import functions as F

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = read_events(spark, config.bootstrap, topic, "read_committed", client)
        if events.where(F.col("event").isNotNull()).select("event.order_id").distinct().count() >= rows:
            return
        time.sleep(1.0)
    logger.warning("not every row of the txbridge sink is visible in %s after 60 s", topic)


def _measure(
    spark: SparkSession,
    config: RunConfig,
    topics: Mapping[str, str],
    truth: Sequence[CommittedOrder],
    client: ClientConfig | None,
) -> tuple[list[PathMetrics], dict[tuple[str, str], list[int]]]:
    frame = truth_frame(spark, truth).cache()
    metrics: list[PathMetrics] = []
    samples: dict[tuple[str, str], list[int]] = {}
    try:
        for sink, path in SINK_PATHS.items():
            # No latency: the rows have no commit time of their own (no visibility given).
            found, latencies = measure(
                spark,
                config.bootstrap,
                path,
                topics[sink],
                isolation="read_committed",
                truth=frame,
                client=client,
            )
            metrics.append(found)
            samples[(path, "read_committed")] = latencies
    finally:
        frame.unpersist()
    return metrics, samples


def _facts(work: Path, rows: int, seconds: float) -> dict[str, Any]:
    """What the comparison did, for the report: the rows, the batches each query committed, which
    faults happened."""
    from spark_pipelines.sink_job import FAIL_AFTER, ROWS_PER_TRANSACTION, SINKS, failed_marker

    commits = {
        sink: len([f for f in (work / f"checkpoint-{sink}" / "commits").glob("[0-9]*") if f.is_file()])
        for sink in SINKS
    }
    return {
        "rows": rows,
        "customers": CUSTOMERS,
        "micro_batches": commits,
        "task_failures": {sink: int(failed_marker(work, sink).exists()) for sink in SINKS},
        "rows_written_before_the_task_failure": FAIL_AFTER,
        "driver_kills": 1,
        # The finished task of the killed batch: its rows are on the Kafka sink's topic twice.
        "rows_per_task_per_batch": -(-rows // BATCHES) // SOURCE_PARTITIONS,
        "txbridge_rows_per_transaction": ROWS_PER_TRANSACTION,
        "seconds": round(seconds, 1),
    }
