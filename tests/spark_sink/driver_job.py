"""A Spark driver running the txbridge sink, as a child process the tests can kill.

``python -m tests.spark_sink.driver_job stream ...``: a streaming query from a Kafka topic,
``trigger(availableNow=True)``, restartable from its checkpoint.
``python -m tests.spark_sink.driver_job retry ...``: a batch write on ``local[2,4]`` whose task
of partition 0 dies (its Python worker exits) on attempt 0 after writing part of its rows.

The driver serves the sink's back-checks (SinkChecks) for ``--linger`` seconds after its query.
The secret comes from ``$SINK_SECRET``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext

from spark_pipelines.session import build_session
from txbridge.spark import SinkChecks, TxbridgeDataSource, register
from txbridge.spark.datasource import TxbridgeBatchWriter


class DyingWriter(TxbridgeBatchWriter):
    """The sink's writer whose task of partition 0 dies on attempt 0 after ``DIE_AFTER`` rows."""

    DIE_AFTER = 12

    def write(self, iterator: Iterator[Any]) -> Any:
        context = TaskContext.get()
        if context is not None and context.partitionId() == 0 and context.attemptNumber() == 0:
            iterator = _die_after(iterator, self.DIE_AFTER)
        return super().write(iterator)


def _die_after(rows: Iterator[Any], count: int) -> Iterator[Any]:
    for n, row in enumerate(rows):
        if n == count:
            time.sleep(1.0)  # the written transactions' halves are acknowledged by now
            os._exit(17)  # an executor's Python worker lost mid-task: nothing is rolled back
        yield row


class DyingSink(TxbridgeDataSource):
    @classmethod
    def name(cls) -> str:
        return "txbridge_dying_once"

    def writer(self, schema: Any, overwrite: bool) -> Any:
        base = super().writer(schema, overwrite)
        return DyingWriter(base.opts)  # type: ignore[attr-defined]


def main() -> None:
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
    args = parser.parse_args()
    secret = os.environ["SINK_SECRET"]
    master = "local[2,4]" if args.mode == "retry" else "local[2]"
    spark = build_session(f"sink-{args.mode}", master=master)
    register(spark)
    spark.dataSource.register(DyingSink)
    with SinkChecks(args.bootstrap, args.group, secret=secret, namespace=args.namespace) as checks:
        options = {
            **checks.options(),
            "secretEnv": "SINK_SECRET",
            "topic": args.out,
            "maxRowsPerTransaction": "5",
        }
        if args.mode == "stream":
            stream = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("subscribe", args.source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "25")
                .load()
                .selectExpr("key", "value")
            )
            query = (
                stream.writeStream.format("txbridge")
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
            ).save()
        print("QUERY DONE", flush=True)
        time.sleep(args.linger)
    spark.stop()


if __name__ == "__main__":
    main()
