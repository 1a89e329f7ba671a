"""Spark batches that outlast the coordinator's back-check budget (real Spark, Kafka, coordinator).

The coordinator here gives up on a transaction fast (3 UNKNOWN answers, or 3 s with nobody to
ask: a budget of about 3 s), so a task that runs 20 s is a batch lasting several budgets, as an
hour-long backfill is under the default budget of about 11 minutes. What a user sees is read
back with a plain read_committed consumer, and the coordinator's counters.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from coordinator.service import Coordinator
from tests.spark_sink.conftest import SECRET, read_topic, sink_namespace
from tests.spark_sink.drivers import assert_once_in_order
from txbridge.spark import SinkChecks, register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 400
SLOW_S = 20.0  # the slow task's pause: about six of the coordinator's budgets


@dataclass
class ShortBudget:
    bootstrap: str
    namespace: str
    coordinator: Coordinator
    checks: SinkChecks

    def options(self, **more: str) -> dict[str, str]:
        return {**self.checks.options(), "secret": SECRET, "maxRowsPerTransaction": "50", **more}


@pytest.fixture(scope="module")
def short_budget(kafka_bootstrap: str) -> Iterator[ShortBudget]:
    """A namespace whose coordinator expires a transaction after about 3 s of no decision."""
    with sink_namespace(
        kafka_bootstrap, "txbl", max_checks=3, max_unasked_s=3.0, checks={"commit_grace_s": 1.0}
    ) as (namespace, service, checks):
        yield ShortBudget(kafka_bootstrap, namespace, service, checks)


def _one_slow_task(spark: SparkSession, slow_s: float) -> DataFrame:
    """:data:`ROWS` rows in 2 tasks; the task holding the last row pauses ``slow_s`` before it,
    after writing its earlier rows. Each key's rows are in one task, in order."""
    from pyspark.sql.functions import col, udf

    last = f"k{(ROWS - 1) % 8}-{ROWS - 1}"

    @udf("string")
    def slow_at_the_end(value: str) -> str:
        if value == last:
            time.sleep(slow_s)
        return value

    rows = [(f"k{i % 8}", f"k{i % 8}-{i}", i) for i in range(ROWS)]
    df = spark.createDataFrame(rows, "key string, value string, i int").repartition(2, "key")
    return df.sortWithinPartitions("i").select("key", slow_at_the_end(col("value")).alias("value"))


def _expected() -> set[str]:
    return {f"k{i % 8}-{i}" for i in range(ROWS)}


def _assert_once(records: list) -> None:
    values = [(r.value() or b"").decode() for r in records]
    lost, duplicated = len(_expected() - set(values)), len(values) - len(set(values))
    assert (lost, duplicated) == (0, 0), f"{lost} of {ROWS} rows lost, {duplicated} duplicated"
    assert_once_in_order(((r.topic(), r.key(), r.value()) for r in records), _expected())


def test_a_batch_outlasting_the_check_budget_publishes_every_row_once(
    spark: SparkSession, short_budget: ShortBudget, topic_factory: Callable[..., str]
) -> None:
    register(spark)
    out = topic_factory(2)
    stats = short_budget.coordinator.stats
    expired_before, running_before = stats["resolved_expired"], stats["checks_running"]

    _one_slow_task(spark, SLOW_S).write.format("txbridge").mode("append").options(
        **short_budget.options(topic=out)
    ).save()

    # The fast task's transactions were asked about while the slow one ran: the driver's check
    # server answered RUNNING, which spends no budget, so none expired and its COMMITs decided.
    _assert_once(read_topic(short_budget.bootstrap, out, at_least=ROWS, settle_s=5.0))
    assert stats["resolved_expired"] == expired_before
    assert stats["checks_running"] > running_before


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_commit_meeting_an_expiry_is_still_published_once_and_the_write_succeeds(
    spark: SparkSession, short_budget: ShortBudget, topic_factory: Callable[..., str]
) -> None:
    register(spark)
    out = topic_factory(2)
    stats = short_budget.coordinator.stats
    expired_before = stats["resolved_expired"]
    # No check server answers at this URL (a driver whose coordinators cannot reach it): the fast
    # task's transactions expire while the slow task runs, before the driver's COMMITs come.
    dead = f"http://127.0.0.1:{_closed_port()}/txbridge/check"
    options = short_budget.options(topic=out, group="spark-sink-unreachable", checkUrl=dead)

    _one_slow_task(spark, 12.0).write.format("txbridge").mode("append").options(**options).save()

    _assert_once(read_topic(short_budget.bootstrap, out, at_least=ROWS, settle_s=5.0))
    assert stats["resolved_expired"] > expired_before  # they did expire, and still came out once
