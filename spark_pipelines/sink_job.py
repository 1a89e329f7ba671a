"""The Spark driver of the demo's fifth comparison: Spark as the producer (docs/demo.md).

``python -m spark_pipelines.sink_job ...`` runs two streaming queries over the same Kafka
source topic, ``trigger(availableNow=True)``: one writes with Spark's built-in Kafka sink
(``format("kafka")``), the other with txbridge's (``format("txbridge")``, through a
subclass that injects the task failure below). Both meet the same faults:

- batch 0: the task of the first partition fails on its first attempt after writing
  :data:`FAIL_AFTER` rows, and Spark retries it (the master is ``local[4,4]``: four tries);
- batch 1: the task of the second partition stops at its first row; once the other task of
  the batch has finished, the driver writes ``ready`` and the demo SIGKILLs it, then starts it
  again on the same checkpoints, which runs batch 1 again.

It is a child process because its driver is killed, and a ``local[N,F]`` session of its own
because the demo's ``local[2]`` one does not retry a failed task. The group's check secret
comes from ``$TXBRIDGE_DEMO_SECRET``; marker files in ``--work`` say which fault happened.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext

from spark_pipelines.workload import SECRET_ENV
from txbridge.client_config import ClientConfig
from txbridge.spark import TxbridgeDataSource
from txbridge.spark.datasource import TxbridgeStreamWriter

#: The failing task writes this many rows before it fails (at least two txbridge transactions).
FAIL_AFTER = 20
#: Rows per txbridge transaction, so the failing task has written some of them when it fails.
ROWS_PER_TRANSACTION = 8
#: ``local[cores, tries]``: a failed task is tried again; four slots, so the two stopped tasks
#: (one per query) leave room for the two that finish.
MASTER = "local[4,4]"
SINKS = ("kafka", "txbridge")
READY = "ready"
PAUSE_S = 3600.0


def failed_marker(work: Path, sink: str) -> Path:
    """Created when ``sink``'s task failure happened."""
    return work / f"{sink}.failed"


def paused_marker(work: Path, sink: str) -> Path:
    """Created when ``sink``'s batch-1 task stopped to wait for the kill."""
    return work / f"{sink}.paused"


def _batch(context: TaskContext) -> str:
    return context.getLocalProperty("streaming.sql.batchId") or ""


def fault_udf(work: str) -> Any:
    """A per-row Python UDF ``(sink, kafka partition, offset) -> fail``: true on the Kafka
    sink's failing row (the query turns it into ``raise_error``, in the JVM, after the rows
    before it were handed to the Kafka producer); on batch 1's second task it stops the task
    until the driver is killed (once: the marker stays)."""
    from pyspark.sql import functions as F

    def fault(sink: str, partition: int, offset: int) -> bool:
        context = TaskContext.get()
        if context is None:
            return False
        batch = _batch(context)
        first_try = context.attemptNumber() == 0
        if sink == "kafka" and batch == "0" and partition == 0 and offset == FAIL_AFTER and first_try:
            failed_marker(Path(work), sink).touch()
            return True
        if batch == "1" and context.partitionId() == 1:
            marker = paused_marker(Path(work), sink)
            if not marker.exists():
                marker.touch()
                time.sleep(PAUSE_S)  # the demo SIGKILLs the driver, and this worker with it
        return False

    return F.udf(fault, "boolean").asNondeterministic()


def _fail_after(rows: Iterator[Any], count: int, marker: Path) -> Iterator[Any]:
    for n, row in enumerate(rows):
        if n == count:
            marker.touch()
            raise RuntimeError(f"the demo's planned task failure after {count} rows")
        yield row


class FailingStreamWriter(TxbridgeStreamWriter):
    """The txbridge sink's stream writer whose first task of batch 0 fails on its first attempt
    after :data:`FAIL_AFTER` rows."""

    def write(self, iterator: Iterator[Any]) -> Any:
        context = TaskContext.get()
        if (
            context is not None
            and _batch(context) == "0"
            and context.partitionId() == 0
            and context.attemptNumber() == 0
        ):
            work = Path(os.environ[_WORK_ENV])
            iterator = _fail_after(iterator, FAIL_AFTER, failed_marker(work, "txbridge"))
        return super().write(iterator)


class DemoTxbridgeSink(TxbridgeDataSource):
    """The ``txbridge`` data source with the demo's task failure, as ``txbridge_demo_faults``."""

    @classmethod
    def name(cls) -> str:
        return "txbridge_demo_faults"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        base = super().streamWriter(schema, overwrite)
        return FailingStreamWriter(base.opts)  # type: ignore[attr-defined]


#: The work folder, for the txbridge writer in the Python workers (they inherit the driver's env).
_WORK_ENV = "TXBRIDGE_DEMO_SINK_WORK"


def _signal_ready(spark: Any, work: Path, stop: threading.Event) -> None:
    """Write ``ready`` once both queries stopped in batch 1 and the other task of each finished."""
    tracker = spark.sparkContext.statusTracker()
    while not stop.is_set():
        if all(paused_marker(work, s).exists() for s in SINKS):
            stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            stages = [s for s in stages if s is not None]
            if len(stages) >= len(SINKS) and all(s.numCompletedTasks >= 1 for s in stages):
                (work / READY).touch()
                return
        time.sleep(0.2)


def _queries(spark: Any, args: argparse.Namespace, client: ClientConfig, checks: Any) -> list[Any]:
    from pyspark.sql import functions as F

    kafka_options = {**client.spark_options(), "kafka.bootstrap.servers": args.bootstrap}
    source = (
        spark.readStream.format("kafka")
        .options(**kafka_options)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    fault = fault_udf(str(args.work))
    queries = []
    for sink in SINKS:
        failing = fault(F.lit(sink), F.col("partition"), F.col("offset"))
        value = F.when(failing, F.raise_error(F.lit("the demo's planned task failure"))).otherwise(
            F.col("value")
        )
        writer = source.select("key", value.alias("value")).writeStream
        if sink == "kafka":
            writer = writer.format("kafka").options(**kafka_options).option("topic", args.kafka_topic)
        else:
            options = {
                **checks.options(),
                "secretEnv": SECRET_ENV,
                "topic": args.txbridge_topic,
                "maxRowsPerTransaction": str(ROWS_PER_TRANSACTION),
            }
            writer = writer.format("txbridge_demo_faults").options(**options)
        checkpoint = str(args.work / f"checkpoint-{sink}")
        queries.append(
            writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).queryName(sink).start()
        )
    return queries


def main() -> None:
    from spark_pipelines.session import build_session
    from txbridge.spark import SinkChecks, register

    parser = argparse.ArgumentParser(prog="python -m spark_pipelines.sink_job")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--kafka-topic", required=True)
    parser.add_argument("--txbridge-topic", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--max-offsets", type=int, required=True)
    parser.add_argument("--linger", type=float, default=2.0)
    parser.add_argument("--command-config", default=None)
    parser.add_argument("-X", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    client = ClientConfig.load(args.command_config, args.overrides)
    os.environ[_WORK_ENV] = str(args.work)
    spark = build_session("txbridge-demo-sinks", master=MASTER)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(DemoTxbridgeSink)
    stop = threading.Event()
    if not (args.work / READY).exists():
        threading.Thread(target=_signal_ready, args=(spark, args.work, stop), daemon=True).start()
    secret = os.environ[SECRET_ENV]
    with SinkChecks(
        args.bootstrap, args.group, secret=secret, namespace=args.namespace, client_config=client
    ) as checks:
        queries = _queries(spark, args, client, checks)
        while any(q.isActive for q in queries):
            # A failed query ends the driver at once: the other may be stopped at its kill point.
            for query in queries:
                if query.exception() is not None:
                    raise SystemExit(f"query {query.name} failed: {query.exception()}")
            time.sleep(0.5)
        for query in queries:
            if query.exception() is not None:
                raise SystemExit(f"query {query.name} failed: {query.exception()}")
        print("QUERIES DONE", flush=True)
        time.sleep(args.linger)  # back-checks of the last batch's transactions, if any, are answered
    stop.set()
    spark.stop()


if __name__ == "__main__":
    main()
