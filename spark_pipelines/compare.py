"""The Spark job: every path's topic against the database, per isolation level.

Each topic is read with the Spark Kafka source (batch, earliest to latest)
under ``read_committed`` and ``read_uncommitted``; values are decoded in Spark
with ``from_avro`` in PERMISSIVE mode, so a record that is not valid Avro is
counted as undecodable instead of failing the job. The orders table of each
path is the ground truth. docs/demo.md defines every metric.

RocketMQ has no topic Spark can read: its watcher's record of every message it
received, in order (an Avro container file, ``spark_pipelines/watcher.py``), is
read instead, with the receive order in place of (partition, offset) and the
receive time as the visibility time; the metrics are computed by the same code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_pipelines.percentiles import percentile
from spark_pipelines.schema import ORDER_CREATED, ORDER_CREATED_JSON
from spark_pipelines.store import CommittedOrder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)

ISOLATIONS = ("read_committed", "read_uncommitted")
ORDER_CREATED_FIELDS = tuple(f["name"] for f in ORDER_CREATED["fields"])


@dataclass(frozen=True)
class PathMetrics:
    """The comparison's numbers for one path under one isolation level."""

    path: str
    isolation: str
    committed: int  # orders committed in the database
    records: int  # records a consumer reads from the topic
    undecodable: int  # records whose value is not an OrderCreated Avro record
    delivered: int  # distinct order ids among decodable records
    lost: int  # committed orders with no event
    phantom: int  # distinct order ids with an event but no committed order
    duplicates: int  # decodable records beyond the first per order id
    order_violations: int  # first events that come after a later order of the same customer
    latency_n: int  # committed and delivered orders with a measured visibility time
    latency_p50_ms: float | None
    latency_p99_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_events(
    spark: SparkSession, bootstrap: str, topic: str, isolation: str, client: ClientConfig | None = None
) -> DataFrame:
    """``partition, offset, event`` of every record; ``event`` is null when the value is not an
    ``OrderCreated`` Avro record.

    Args:
        client: the cluster's client settings (security), given to the Kafka source as its
            ``kafka.``-prefixed Java client options.
    """
    raw = (
        spark.read.format("kafka")
        .options(**(client.spark_options() if client is not None else {}))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", isolation)
        .load()
    )
    return _decode(raw)


def read_received(spark: SparkSession, source: Path) -> DataFrame:
    """``partition, offset, received_ms, event`` of every message a RocketMQ watcher received:
    ``partition`` 0 and ``offset`` the position in the order received; ``event`` as in
    :func:`read_events`.

    The file is read here, on the driver, and shipped as rows: on a cluster across hosts the
    executors cannot see the driver's files."""
    from pyspark.sql import functions as F

    from spark_pipelines.watcher import load_received

    raw = spark.createDataFrame(
        [(r.seq, r.received_ms, r.body) for r in load_received(source)],
        "seq long, received_ms long, body binary",
    )
    framed = raw.select(
        F.lit(0).alias("partition"),
        F.col("seq").alias("offset"),
        "received_ms",
        F.col("body").alias("value"),
    )
    return _decode(framed, keep=("received_ms",))


def _decode(raw: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    decoded = raw.select(
        "partition",
        "offset",
        *keep,
        "value",
        from_avro(F.col("value"), ORDER_CREATED_JSON, {"mode": "PERMISSIVE"}).alias("event"),
    )
    # Avro has no framing: some foreign bytes decode to a (garbage) record. Only a value
    # that re-encodes to exactly its own bytes counts as an OrderCreated record.
    # PERMISSIVE gives a struct of nulls for bytes it cannot read; to_avro must only see complete ones.
    complete = F.col("event").isNotNull()
    for name in ORDER_CREATED_FIELDS:
        complete = complete & F.col(f"event.{name}").isNotNull()
    exact = F.when(complete, to_avro(F.col("event"), ORDER_CREATED_JSON) == F.col("value")).otherwise(False)
    return decoded.select("partition", "offset", *keep, F.when(exact, F.col("event")).alias("event"))


def truth_frame(spark: SparkSession, orders: Sequence[CommittedOrder]) -> DataFrame:
    rows = [(o.order_id, o.customer_id, o.customer_seq, o.committed_ms) for o in orders]
    return spark.createDataFrame(
        rows, "order_id string, customer_id string, customer_seq long, committed_ms long"
    )


def _order_violations(events: DataFrame) -> int:
    """First events (per order id) whose customer_seq is below one already seen for that customer."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = events.groupBy("order_id").agg(
        F.min(F.struct("partition", "offset", "customer_id", "customer_seq")).alias("f")
    )
    flat = first.select("f.partition", "f.offset", "f.customer_id", "f.customer_seq")
    before = (
        Window.partitionBy("customer_id")
        .orderBy("partition", "offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    flagged = flat.withColumn("max_before", F.max("customer_seq").over(before))
    return flagged.where(F.col("customer_seq") < F.col("max_before")).count()


def measure(
    spark: SparkSession,
    bootstrap: str,
    path: str,
    topic: str,
    *,
    isolation: str,
    truth: DataFrame,
    visibility: Mapping[str, int] | None = None,
    client: ClientConfig | None = None,
) -> tuple[PathMetrics, list[int]]:
    """The metrics of one topic under one isolation level, and the latency samples (ms)."""
    read = read_events(spark, bootstrap, topic, isolation, client).cache()
    try:
        seen = None
        if visibility:
            seen = spark.createDataFrame(list(visibility.items()), "order_id string, first_seen_ms long")
        return _measure(read, path, isolation, truth, seen)
    finally:
        read.unpersist()


def measure_received(
    spark: SparkSession, path: str, source: Path, *, truth: DataFrame, isolation: str = "read_committed"
) -> tuple[PathMetrics, list[int]]:
    """The metrics of what a RocketMQ watcher received (``source``, its saved record), and the
    latency samples (ms): visible = the first time the watcher received the order."""
    from pyspark.sql import functions as F

    read = read_received(spark, source).cache()
    try:
        seen = (
            read.where(F.col("event").isNotNull())
            .groupBy(F.col("event.order_id").alias("order_id"))
            .agg(F.min("received_ms").alias("first_seen_ms"))
        )
        return _measure(read, path, isolation, truth, seen)
    finally:
        read.unpersist()


def _measure(
    read: DataFrame, path: str, isolation: str, truth: DataFrame, seen: DataFrame | None
) -> tuple[PathMetrics, list[int]]:
    """The metrics of ``read`` (``partition, offset, event``) against ``truth``; ``seen``:
    ``order_id, first_seen_ms``.

    Two Spark jobs: the counts, the gaps and the latencies from one full outer join of the
    records per order id with the committed orders, then the order violations. One job per
    figure (eight of them) took half as long again (docs/results/2026-11-29-demo-time.md).
    """
    from pyspark.sql import functions as F

    # One row per order id read (the null id: every undecodable record), with its record count.
    per_id = read.groupBy(F.col("event.order_id").alias("order_id")).agg(F.count(F.lit(1)).alias("n"))
    rows = per_id.join(truth.withColumn("in_truth", F.lit(True)), "order_id", "full_outer")
    if seen is not None:
        rows = rows.join(seen, "order_id", "left")
    in_topic = F.col("order_id").isNotNull() & F.col("n").isNotNull()
    in_truth = F.col("in_truth").isNotNull()
    latency = F.col("first_seen_ms") - F.col("committed_ms") if seen is not None else F.lit(None).cast("long")
    events = read.where(F.col("event").isNotNull()).select(
        "partition",
        "offset",
        F.col("event.order_id").alias("order_id"),
        F.col("event.customer_id").alias("customer_id"),
        F.col("event.customer_seq").alias("customer_seq"),
    )
    counts = rows.agg(
        F.coalesce(F.sum("n"), F.lit(0)).alias("records"),
        F.coalesce(F.sum(F.when(F.col("order_id").isNull(), F.col("n"))), F.lit(0)).alias("undecodable"),
        F.count(F.when(in_topic, True)).alias("delivered"),
        F.count(F.when(in_truth, True)).alias("committed"),
        F.count(F.when(in_truth & ~in_topic, True)).alias("lost"),
        F.count(F.when(in_topic & ~in_truth, True)).alias("phantom"),
        F.collect_list(F.when(in_topic & in_truth, latency)).alias("latencies"),
    ).collect()[0]  # an aggregate without grouping: one row
    decodable = counts.records - counts.undecodable
    latencies = sorted(int(v) for v in counts.latencies)
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    metrics = PathMetrics(
        path=path,
        isolation=isolation,
        committed=counts.committed,
        records=counts.records,
        undecodable=counts.undecodable,
        delivered=counts.delivered,
        lost=counts.lost,
        phantom=counts.phantom,
        duplicates=decodable - counts.delivered,
        order_violations=_order_violations(events),
        latency_n=len(latencies),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
    )
    logger.info("%s/%s: %s", path, isolation, metrics)
    return metrics, latencies


def compare(
    spark: SparkSession,
    bootstrap: str,
    topics: Mapping[str, str],
    ground_truth: Mapping[str, Sequence[CommittedOrder]],
    *,
    visibility: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
    isolations: Sequence[str] = ISOLATIONS,
    client: ClientConfig | None = None,
    received: Mapping[str, Path] | None = None,
) -> tuple[list[PathMetrics], dict[tuple[str, str], list[int]]]:
    """Measure every path under every isolation level.

    Args:
        spark: the session (with the Kafka source and spark-avro jars).
        bootstrap: Kafka bootstrap servers.
        topics: ``{path: topic}`` of the Kafka paths.
        ground_truth: ``{path: committed orders}`` read from each path's database.
        visibility: ``{(path, isolation): {order_id: first_seen_ms}}`` from the watchers.
        isolations: which isolation levels to read with.
        client: the cluster's client settings (security).
        received: ``{path: record}`` of the paths read from a watcher's record of what it
            received (rocketmq), measured once, as ``read_committed``: RocketMQ has no
            isolation levels and its consumers see committed transactions only.

    Returns:
        The metrics, and the latency samples per ``(path, isolation)``.
    """
    results: list[PathMetrics] = []
    samples: dict[tuple[str, str], list[int]] = {}
    for path, topic in topics.items():
        truth = truth_frame(spark, ground_truth[path]).cache()
        try:
            for isolation in isolations:
                seen = (visibility or {}).get((path, isolation))
                metrics, latencies = measure(
                    spark,
                    bootstrap,
                    path,
                    topic,
                    isolation=isolation,
                    truth=truth,
                    visibility=seen,
                    client=client,
                )
                results.append(metrics)
                samples[(path, isolation)] = latencies
        finally:
            truth.unpersist()
    for path, source in (received or {}).items():
        truth = truth_frame(spark, ground_truth[path]).cache()
        try:
            metrics, latencies = measure_received(spark, path, source, truth=truth)
        finally:
            truth.unpersist()
        results.append(metrics)
        samples[(path, metrics.isolation)] = latencies
    return results, samples
