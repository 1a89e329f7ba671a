"""A Spark driver running the txbridge sink, as a child process the tests can kill.

``python -m tests.spark_sink.driver_job stream ...``: a streaming query from a Kafka topic,
``trigger(availableNow=True)``, restartable from its checkpoint; with ``--fail-batch N`` (on
``local[2,4]``) the task of partition 0 of micro-batch N dies on attempt 0 after part of its rows.
``python -m tests.spark_sink.driver_job retry ...``: a batch write on ``local[2,4]`` whose task
of partition 0 dies (its Python worker exits) on attempt 0 after writing part of its rows; with
``--hang-file F`` it writes its pid to ``F`` there and waits to be killed instead (the test
SIGKILLs its executor).

The sink's client settings come from ``--client-properties`` (a Java client properties file),
passed as option ``clientProperties`` or, with ``--client-via options``, as ``kafka.*`` options;
those of the Kafka source from ``--source-properties``. ``--master`` runs on a Spark cluster;
``--check-host``, ``--check-port`` and ``--advertised-url`` go to ``SinkChecks``.

The driver serves the sink's back-checks (SinkChecks) for ``--linger`` seconds after its query.
The secret comes from ``$SINK_SECRET``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext

from spark_pipelines.session import build_session
from txbridge.client_config import ClientConfig
from txbridge.spark import SinkChecks, TxbridgeDataSource, register
from txbridge.spark.datasource import TxbridgeBatchWriter, TxbridgeStreamWriter

#: The rows a failing task writes before it dies (with 5 rows per transaction: 2 transactions) ...
DIE_AFTER = 12
#: ... and in a micro-batch of at most 25 rows from 2 source partitions (1 transaction).
DIE_AFTER_IN_BATCH = 7


def _first_attempt_of_partition_0(batch_id: int | None = None) -> bool:
    context = TaskContext.get()
    if context is None or context.partitionId() != 0 or context.attemptNumber() != 0:
        return False
    return batch_id is None or context.getLocalProperty("streaming.sql.batchId") == str(batch_id)


def _die_after(rows: Iterator[Any], count: int, hang_file: str) -> Iterator[Any]:
    for n, row in enumerate(rows):
        if n == count:
            time.sleep(1.0)  # the written transactions' halves are acknowledged by now
            if not hang_file:
                os._exit(17)  # an executor's Python worker lost mid-task: nothing is rolled back
            Path(hang_file).write_text(f"{os.getpid()}\n")
            while True:  # the test SIGKILLs this executor now
                time.sleep(1.0)
        yield row


class DyingWriter(TxbridgeBatchWriter):
    """The sink's writer whose task of partition 0 dies on attempt 0 after :data:`DIE_AFTER` rows
    (or, with ``hang_file``, writes its pid there and waits to be killed)."""

    def __init__(self, base: TxbridgeBatchWriter, hang_file: str) -> None:
        super().__init__(base.opts)
        self.hang_file = hang_file

    def write(self, iterator: Iterator[Any]) -> Any:
        if _first_attempt_of_partition_0():
            iterator = _die_after(iterator, DIE_AFTER, self.hang_file)
        return super().write(iterator)


class DyingStreamWriter(TxbridgeStreamWriter):
    """The sink's stream writer whose task of partition 0 of micro-batch ``fail_batch`` dies on
    attempt 0 after :data:`DIE_AFTER_IN_BATCH` rows."""

    def __init__(self, base: TxbridgeStreamWriter, fail_batch: int) -> None:
        super().__init__(base.opts)
        self.fail_batch = fail_batch

    def write(self, iterator: Iterator[Any]) -> Any:
        if _first_attempt_of_partition_0(self.fail_batch):
            iterator = _die_after(iterator, DIE_AFTER_IN_BATCH, "")
        return super().write(iterator)


class DyingSink(TxbridgeDataSource):
    """The sink with the failures above; its own options ``testHangFile`` and ``testFailBatch``
    are taken out before the sink checks the others."""

    @classmethod
    def name(cls) -> str:
        return "txbridge_dying_once"

    def writer(self, schema: Any, overwrite: bool) -> Any:
        hang_file = self.options.pop("testHangFile", "")
        return DyingWriter(super().writer(schema, overwrite), hang_file)  # type: ignore[arg-type]

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        fail_batch = int(self.options.pop("testFailBatch", "-1"))
        return DyingStreamWriter(super().streamWriter(schema, overwrite), fail_batch)  # type: ignore[arg-type]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stream", "retry"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--source", default="")
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--sink-id", default="")
    parser.add_argument("--master", default="")
    parser.add_argument("--fail-batch", type=int, default=-1)
    parser.add_argument("--hang-file", default="")
    parser.add_argument("--client-properties", default="")
    parser.add_argument("--client-via", choices=["properties", "options"], default="properties")
    parser.add_argument("--source-properties", default="")
    parser.add_argument("--check-host", default="127.0.0.1")
    parser.add_argument("--check-port", type=int, default=0)
    parser.add_argument("--advertised-url", default="")
    return parser.parse_args()


def _sink_options(checks: SinkChecks, client: ClientConfig, args: argparse.Namespace) -> dict[str, str]:
    options = {
        **checks.options(),
        "secretEnv": "SINK_SECRET",
        "topic": args.out,
        "maxRowsPerTransaction": "5",
    }
    if args.client_via == "options":  # the settings as kafka.* options (Java names), not the file
        options.pop("clientProperties", None)
        options.update(client.spark_options())
    return options


def main() -> None:
    args = _arguments()
    secret = os.environ["SINK_SECRET"]
    failing = args.mode == "retry" or args.fail_batch >= 0
    master = args.master or ("local[2,4]" if failing else "local[2]")
    # Only the stream reads Kafka through Spark; the retry runs beside a pyspark without its jars.
    spark = build_session(f"sink-{args.mode}", master=master, kafka_source=args.mode == "stream")
    register(spark)
    spark.dataSource.register(DyingSink)
    client = ClientConfig.load(args.client_properties or None)
    with SinkChecks(
        args.bootstrap,
        args.group,
        secret=secret,
        namespace=args.namespace,
        client_config=client,
        check_host=args.check_host,
        check_port=args.check_port,
        advertised_url=args.advertised_url or None,
    ) as checks:
        options = _sink_options(checks, client, args)
        if args.mode == "stream":
            source = ClientConfig.load(args.source_properties or None)
            stream = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .options(**source.spark_options())
                .option("subscribe", args.source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "25")
                .load()
                .selectExpr("key", "value")
            )
            if failing:
                options["testFailBatch"] = str(args.fail_batch)
            query = (
                stream.writeStream.format("txbridge_dying_once" if failing else "txbridge")
                .options(**options)
                .option("checkpointLocation", args.checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        else:
            rows = [(f"k{i % 8}", f"k{i % 8}-{i}", i) for i in range(args.rows)]
            df = spark.createDataFrame(rows, "key string, value string, i int").repartition(2, "key")
            df = df.sortWithinPartitions("i").drop("i")
            df.write.format("txbridge_dying_once").mode("append").options(**options).option(
                "sinkId", args.sink_id
            ).option("testHangFile", args.hang_file).save()
        print("QUERY DONE", flush=True)
        time.sleep(args.linger)
    spark.stop()


if __name__ == "__main__":
    main()
