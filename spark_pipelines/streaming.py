"""A running per-customer order count over txbridge's committed topic (Structured Streaming).

The query reads the topic with ``read_committed``, decodes the Avro values,
and keeps ``count(*)`` per customer in Spark's state store; the checkpoint
holds both the Kafka offsets and that state. Each micro-batch upserts the
*absolute* running counts into a SQLite sink keyed by customer, so a batch that
Spark replays after a restart rewrites the same numbers: stop the query, start
it again on the same checkpoint, and nothing is counted twice.

On a Spark cluster the executors write the state and the driver the offsets, both
under the checkpoint: every host of the cluster must see it at the same path. A
local path does on one machine (``local[N]``, or a cluster on 127.0.0.1); across
hosts it must be a shared filesystem mounted at the same path, or an ``hdfs://`` or
``s3a://`` URI (with the Hadoop connector on Spark's classpath).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spark_pipelines.schema import ORDER_CREATED_JSON

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)


class CountSink:
    """The SQLite table ``customer_orders(customer_id PK, orders, batch_id)``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS customer_orders "
            "(customer_id TEXT PRIMARY KEY, orders INTEGER NOT NULL, batch_id INTEGER NOT NULL)"
        )
        return conn

    def upsert(self, rows: list[tuple[str, int]], batch_id: int) -> None:
        conn = self._connect()
        try:
            with conn:  # one transaction per batch: all rows or none
                conn.executemany(
                    "INSERT INTO customer_orders (customer_id, orders, batch_id) VALUES (?, ?, ?) "
                    "ON CONFLICT(customer_id) DO UPDATE SET"
                    " orders = excluded.orders, batch_id = excluded.batch_id",
                    [(customer, count, batch_id) for customer, count in rows],
                )
        finally:
            conn.close()

    def counts(self) -> dict[str, int]:
        conn = self._connect()
        try:
            return dict(conn.execute("SELECT customer_id, orders FROM customer_orders").fetchall())
        finally:
            conn.close()


class CustomerCounts:
    """The streaming query and its sink.

    Args:
        spark: the session.
        bootstrap: Kafka bootstrap servers.
        topic: the topic to count (txbridge's committed topic).
        workdir: holds ``counts.sqlite`` (written by the driver) and, by default, ``checkpoint/``.
        trigger: the micro-batch interval.
        client: the cluster's client settings (security), as ``kafka.``-prefixed Java client options.
        checkpoint: the checkpoint location, a path or a URI (``hdfs://``, ``s3a://``) that every
            executor reaches; ``workdir/checkpoint`` by default.
    """

    def __init__(
        self,
        spark: SparkSession,
        bootstrap: str,
        topic: str,
        workdir: Path,
        *,
        trigger: str = "2 seconds",
        client: ClientConfig | None = None,
        checkpoint: str | None = None,
    ) -> None:
        self.spark = spark
        self.bootstrap = bootstrap
        self._options = client.spark_options() if client is not None else {}
        self.topic = topic
        # Absolute: a relative location would be resolved against each process's working directory.
        self.checkpoint = checkpoint or str((workdir / "checkpoint").resolve())
        self.sink = CountSink(workdir / "counts.sqlite")
        self.trigger = trigger
        self.starts = 0
        self._query: StreamingQuery | None = None

    def _counts(self) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        source = (
            self.spark.readStream.format("kafka")
            .options(**self._options)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .load()
        )
        events = source.select(
            from_avro(F.col("value"), ORDER_CREATED_JSON, {"mode": "PERMISSIVE"}).alias("e")
        )
        return (
            events.where(F.col("e").isNotNull()).groupBy(F.col("e.customer_id").alias("customer_id")).count()
        )

    def _check_checkpoint(self) -> None:
        from spark_pipelines.session import runs_on_this_host

        master = self.spark.sparkContext.master or ""
        if urlsplit(self.checkpoint).scheme in ("", "file") and not runs_on_this_host(master):
            logger.warning(
                "the streaming checkpoint %s is a local path but %s may run executors on other hosts: "
                "it must be on a filesystem every host mounts at that path (or pass an hdfs:// or "
                "s3a:// location)",
                self.checkpoint,
                master,
            )

    def start(self) -> None:
        """Start (or resume from the checkpoint)."""
        if self.starts == 0:
            self._check_checkpoint()
        sink = self.sink
        sink.path.parent.mkdir(parents=True, exist_ok=True)

        def write(batch: Any, batch_id: int) -> None:
            sink.upsert([(r.customer_id, int(r["count"])) for r in batch.collect()], batch_id)

        self.starts += 1
        self._query = (
            self._counts()
            .writeStream.outputMode("update")
            .foreachBatch(write)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime=self.trigger)
            .queryName(f"customer_counts_{self.starts}")
            .start()
        )
        logger.info("streaming count started (%d) on %s", self.starts, self.topic)

    def stop(self, timeout: float = 300.0) -> None:
        """Stop between micro-batches: wait up to ``timeout`` for the running one to end.

        A batch interrupted mid-way is replayed on restart, so the counts stay right, but an
        interrupted ``foreachBatch`` fails noisily in Spark; on a cluster whose executors are
        still starting, the first batch takes minutes on a busy machine.
        """
        query, self._query = self._query, None
        if query is None:
            return
        deadline = time.monotonic() + timeout
        while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.05)
        if query.isActive and query.status.get("isTriggerActive"):
            logger.warning("the streaming batch still runs after %.0fs; interrupting it", timeout)
        query.stop()

    def restart(self) -> None:
        """Stop the query and start it again on the same checkpoint."""
        self.stop()
        self.start()

    def catch_up(self) -> None:
        """Block until everything available now is processed.

        Raises:
            RuntimeError: the query is not running (its exception, if any, is chained).
        """
        if self._query is None:
            raise RuntimeError("the streaming query is not running")
        self._query.processAllAvailable()

    def counts(self) -> dict[str, int]:
        """The sink's per-customer counts."""
        return self.sink.counts()
