"""The txbridge Spark sink end to end: real Spark, real Kafka, a real coordinator.

What a user sees is read back with a plain confluent-kafka read_committed consumer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from tests.soak import soak_only, soak_test
from tests.spark_sink.conftest import GROUP, SECRET, SinkEnv, read_topic
from tests.spark_sink.drivers import (
    ROOT,
    assert_once_in_order,
    finish_driver,
    kill_driver,
    start_driver,
    wait_for_file,
)
from txbridge.spark import H_BATCH, parse_options, register
from txbridge.spark.decide import PAUSE_ENV, abort_batch
from txbridge.spark.decisions import batch_label
from txbridge.spark.executor import write_task
from txbridge.spark.options import sink_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark_sink(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


def _values(records: list) -> list[str]:
    return [r.value().decode() for r in records]


def _assert_once_in_order(records: list, expected: set[str], *, ordered: bool = True) -> None:
    assert_once_in_order(((r.topic(), r.key(), r.value()) for r in records), expected, ordered=ordered)


def test_batch_write_publishes_every_row_once_with_key_order_headers_and_topics(
    spark_sink: SparkSession, sink_env: SinkEnv, topic_factory: Callable[..., str]
) -> None:
    first, second = topic_factory(3), topic_factory(2)
    rows = [
        (f"k{i % 5}", f"k{i % 5}-{i}", first if i % 3 else second, [("origin", b"test")], i)
        for i in range(120)
    ]
    df = (
        spark_sink.createDataFrame(
            rows,
            "key string, value string, topic string, headers array<struct<key:string,value:binary>>, i int",
        )
        .repartition(3, "key")
        .sortWithinPartitions("i")
        .drop("i")
    )
    df.write.format("txbridge").mode("append").options(**sink_env.options(maxRowsPerTransaction="7")).save()

    got_first = read_topic(sink_env.bootstrap, first, at_least=80)
    got_second = read_topic(sink_env.bootstrap, second, at_least=40)

    _assert_once_in_order(got_first + got_second, {v for _, v, _, _, _ in rows})
    assert {r.value().decode() for r in got_second} == {v for _, v, t, _, _ in rows if t == second}
    headers = dict(got_first[0].headers())
    assert headers["origin"] == b"test"
    assert H_BATCH in headers


def test_streaming_query_from_kafka_writes_every_row_once(
    spark_sink: SparkSession,
    spark_kafka_source: None,
    sink_env: SinkEnv,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    source, out = topic_factory(2), topic_factory(3)
    producer = Producer({"bootstrap.servers": sink_env.bootstrap})
    for i in range(150):
        producer.produce(source, key=f"k{i % 7}".encode(), value=f"k{i % 7}-{i}".encode())
    producer.flush(30)
    stream = (
        spark_sink.readStream.format("kafka")
        .option("kafka.bootstrap.servers", sink_env.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .selectExpr("key", "value")
    )
    query = (
        stream.writeStream.format("txbridge")
        .options(**sink_env.options(topic=out, maxRowsPerTransaction="9"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None

    _assert_once_in_order(
        read_topic(sink_env.bootstrap, out, at_least=150), {f"k{i % 7}-{i}" for i in range(150)}
    )


def test_the_same_batch_written_twice_is_published_once(
    spark_sink: SparkSession, sink_env: SinkEnv, topic_factory: Callable[..., str]
) -> None:
    out = topic_factory(2)
    df = spark_sink.createDataFrame(
        [(f"k{i % 3}", f"k{i % 3}-{i}") for i in range(30)], "key string, value string"
    )
    sink_id = f"rerun-{uuid.uuid4().hex[:8]}"
    for _ in range(2):  # a driver re-running a batch it may have decided: same sink id, same batch
        df.coalesce(2).write.format("txbridge").mode("append").options(
            **sink_env.options(topic=out, sinkId=sink_id, maxRowsPerTransaction="4")
        ).save()

    # coalesce(2) puts each key's rows in both tasks, and order across tasks is not kept (as with
    # Spark's Kafka sink): only once-ness is this test's.
    _assert_once_in_order(
        read_topic(sink_env.bootstrap, out, at_least=30, settle_s=5.0),
        {f"k{i % 3}-{i}" for i in range(30)},
        ordered=False,
    )


@pytest.mark.parametrize(
    "case",
    [
        ("group", {}, "option group"),
        ("checkUrl", {}, "option checkUrl"),
        ("secret", {}, "option secret"),
        (None, {"maxRowsPerTransaction": "zero"}, "option maxRowsPerTransaction"),
        (None, {"kafka.sasl.mechanizm": "PLAIN"}, "sasl.mechanizm"),
        (None, {"topik": "x"}, "'topik'"),
    ],
)
def test_a_missing_or_bad_option_fails_before_any_row_is_written(
    spark_sink: SparkSession,
    sink_env: SinkEnv,
    topic_factory: Callable[..., str],
    case: tuple[str | None, dict[str, str], str],
) -> None:
    drop, extra, named = case
    out = topic_factory(1)
    options = {k: v for k, v in sink_env.options(topic=out, **extra).items() if k != drop}
    df = spark_sink.createDataFrame([("k", "v-1")], "key string, value string")

    with pytest.raises(Exception, match="txbridge sink") as failure:
        df.write.format("txbridge").mode("append").options(**options).save()

    assert named in str(failure.value)
    assert "spark-sink-secret" not in str(failure.value)
    assert read_topic(sink_env.bootstrap, out, at_least=0, settle_s=1.0) == []


def _ops(bootstrap: str, op_topic: str, tx_ids: set[str], *, timeout: float = 60.0) -> dict[str, list[dict]]:
    """The op records of ``tx_ids`` (decoded), waiting until each has one."""
    found: dict[str, list[dict]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = defaultdict(list)
        for r in read_topic(bootstrap, op_topic, at_least=0, settle_s=1.0):
            key = (r.key() or b"").decode()
            if key in tx_ids:
                found[key].append(json.loads(r.value()))
        if set(found) >= tx_ids:
            break
        time.sleep(1.0)
    return found


def _halves_of(bootstrap: str, half_topic: str, label: str) -> set[str]:
    """The tx ids of the half records whose messages carry ``label``."""
    txs = set()
    for r in read_topic(bootstrap, half_topic, at_least=0, settle_s=1.0):
        headers = dict(r.headers() or [])
        if headers.get(H_BATCH) == label.encode():
            txs.add(headers["txb.tx"].decode())
    return txs


def test_an_abort_publishes_nothing_and_rolls_the_halves_back(
    sink_env: SinkEnv, topic_factory: Callable[..., str]
) -> None:
    out = topic_factory(2)
    opts = parse_options(
        sink_env.options(topic=out, sinkId=f"abort-{uuid.uuid4().hex[:8]}", maxRowsPerTransaction="3"),
        streaming=False,
    )
    rows = [{"key": f"k{i % 2}", "value": f"k{i % 2}-{i}"} for i in range(10)]
    refs = [
        write_task(opts, rows[:6], batch_id=0, partition_id=0, attempt=0),
        write_task(opts, rows[6:], batch_id=0, partition_id=1, attempt=0),
    ]
    tx_ids = {r.tx_id for task in refs for r in task}

    abort_batch(opts, 0, [r for task in refs for r in task])

    ops = _ops(sink_env.bootstrap, sink_env.topics.op, tx_ids)
    assert {tx: [o["state"] for o in found] for tx, found in ops.items()} == {
        tx: ["ROLLBACK"] for tx in tx_ids
    }
    assert len(tx_ids) == 4
    assert read_topic(sink_env.bootstrap, out, at_least=0, settle_s=4.0) == []


def _driver(sink_env: SinkEnv, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return start_driver(
        *args, bootstrap=sink_env.bootstrap, namespace=sink_env.namespace, group=GROUP, secret=SECRET, env=env
    )


# That test runs the kill before the decision record and a task failure in batch 0, in one query.
_ON_THE_CLUSTER = (
    "the same fault on the secured cluster runs in make test (tests/secure/test_spark_sink_secure.py)"
)


@pytest.mark.parametrize(
    "stage",
    ["after-decision", pytest.param("before-decision", marks=soak_only(f"2 minutes; {_ON_THE_CLUSTER}"))],
)
def test_a_driver_killed_in_its_commit_restarts_from_its_checkpoint_with_nothing_lost_or_doubled(
    spark_kafka_source: None, sink_env: SinkEnv, topic_factory: Callable[..., str], tmp_path: Path, stage: str
) -> None:
    source, out = topic_factory(2), topic_factory(3)
    producer = Producer({"bootstrap.servers": sink_env.bootstrap})
    for i in range(100):
        producer.produce(source, key=f"k{i % 5}".encode(), value=f"k{i % 5}-{i}".encode())
    producer.flush(30)
    checkpoint, paused = str(tmp_path / "checkpoint"), tmp_path / "paused"
    args = ("stream", "--source", source, "--out", out, "--checkpoint", checkpoint)

    first = _driver(sink_env, *args, env={PAUSE_ENV: f"{stage}:1:{paused}"})
    wait_for_file(paused, first, "batch 1's commit")
    kill_driver(first)  # batch 1's record written (or not), no COMMIT op yet
    if stage == "after-decision":
        # The back-checks publish batch 1 from its record (SinkChecks outlives the driver), in
        # whatever order they are asked: per-key order is the coordinator's to keep. The
        # restart's re-sent COMMITs then come after, and must publish nothing twice.
        assert len(read_topic(sink_env.bootstrap, out, at_least=50, settle_s=0.0)) >= 50  # batches 0, 1
    finish_driver(_driver(sink_env, *args))

    _assert_once_in_order(
        read_topic(sink_env.bootstrap, out, at_least=100, settle_s=5.0), {f"k{i % 5}-{i}" for i in range(100)}
    )


@soak_test(f"70 s; {_ON_THE_CLUSTER}")
def test_a_task_that_dies_after_part_of_its_rows_is_retried_with_nothing_lost_or_doubled(
    sink_env: SinkEnv, topic_factory: Callable[..., str]
) -> None:
    out = topic_factory(2)
    sink_id = f"retry-{uuid.uuid4().hex[:8]}"

    output = finish_driver(
        _driver(sink_env, "retry", "--out", out, "--rows", "160", "--sink-id", sink_id, "--linger", "10")
    )

    assert "QUERY DONE" in output
    _assert_once_in_order(
        read_topic(sink_env.bootstrap, out, at_least=160, settle_s=5.0),
        {f"k{i % 8}-{i}" for i in range(160)},
    )
    # The dead attempt's transactions were written and left undecided; the driver rolled them back
    # (from their journal entries) before the retry's COMMITs, so none of the retry's was held.
    written = _halves_of(sink_env.bootstrap, sink_env.topics.half, batch_label(sink_key(sink_id), 0))
    ops = _ops(sink_env.bootstrap, sink_env.topics.op, written)
    states = {tx: found[0]["state"] for tx, found in ops.items()}
    rolled_back = {tx for tx, state in states.items() if state == "ROLLBACK"}
    assert rolled_back, "the dying attempt wrote no transaction"
    assert sum(1 for s in states.values() if s == "COMMIT") == 160 // 5


def test_the_example_publishes_its_orders_once(sink_env: SinkEnv, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("orders")
    result = subprocess.run(
        [
            sys.executable,
            "examples/spark_sink.py",
            "--bootstrap",
            sink_env.bootstrap,
            "--topic",
            topic,
            *("--namespace", sink_env.namespace, "--rows", "12"),
        ],
        cwd=ROOT,
        env={**os.environ, "TXBRIDGE_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-5000:]
    assert f"published 12 orders to {topic} once" in result.stdout
    values = _values(read_topic(sink_env.bootstrap, topic, at_least=12))
    assert sorted(values) == sorted({f'{{"order": {i}, "amount": {10 * i}}}' for i in range(12)})
