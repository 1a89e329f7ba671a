"""Issue 2: a real Kafka, native transactions and Spark's Kafka source on it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from servers.broker import LocalKafka, free_port
from tests.kafka_helpers import read_topic
from txbridge import kafka
from txbridge.errors import BrokerError, KafkaOperationError

pytestmark = pytest.mark.integration


def test_produced_message_is_consumed_back(kafka_bootstrap: str, topic_factory: Callable[..., str]) -> None:
    topic = topic_factory()
    producer = kafka.producer(kafka_bootstrap)
    producer.produce(topic, key=b"order-1", value=b"created", headers=[("h", b"1")])
    assert producer.flush(15) == 0

    seen = read_topic(kafka_bootstrap, topic)

    assert [(s.key, s.value, s.headers) for s in seen] == [(b"order-1", b"created", {"h": b"1"})]


def test_consume_available_returns_what_is_there_without_waiting_out_the_timeout(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=1)
    producer = kafka.producer(kafka_bootstrap)
    for i in range(3):
        producer.produce(topic, value=f"m{i}".encode())
    assert producer.flush(15) == 0
    consumer = kafka.consumer(kafka_bootstrap, f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    consumer.assign([kafka.partition_at(topic, 0, 0)])
    try:
        got: list[bytes] = []
        started = time.monotonic()
        while len(got) < 3 and time.monotonic() - started < 30:
            got += [m.value() for m in kafka.consume_available(consumer, 1000, 30) if m.error() is None]
        elapsed = time.monotonic() - started
        assert kafka.consume_available(consumer, 1000, 0.2) == []  # nothing more: empty after the wait
    finally:
        consumer.close()
    assert got == [b"m0", b"m1", b"m2"]
    # consume(1000, 30) would have sat out the 30 s for want of 1000 records.
    assert elapsed < 30


def _commit_then_abort(bootstrap: str, topic: str) -> None:
    """Offsets 0-2 committed (marker at 3), 4-5 aborted (marker at 6)."""
    producer = kafka.producer(bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"k", value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, key=b"k", value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)


def test_read_to_end_ends_past_markers_and_aborted_records_or_at_partition_eof(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    _commit_then_abort(kafka_bootstrap, topic)  # the end: 7, past the abort marker

    def read(ends: dict[int, int | None], timeout: float = 30, **options: object) -> list[bytes | None]:
        consumer = kafka.consumer(
            kafka_bootstrap, f"g-{uuid.uuid4().hex[:8]}", fetch_wait_max_ms=10, **options
        )
        consumer.assign([kafka.partition_at(topic, 0, kafka.FROM_START)])
        try:
            return [m.value() for m in kafka.read_to_end(consumer, topic, ends, timeout=timeout, what="t")]
        finally:
            consumer.close()

    committed = [b"committed-0", b"committed-1", b"committed-2"]
    # The last committed record is at 2: only the position says the read got past 3-6.
    assert read({0: 7}) == committed
    assert read({0: None}, enable_partition_eof=True) == committed
    started = time.monotonic()
    with pytest.raises(KafkaOperationError, match=r"t: partitions \[0\] did not reach their end in 1s"):
        read({0: 8}, timeout=1)
    assert time.monotonic() - started < 10


def test_created_topics_are_listed_with_leaders_when_ensure_topics_returns(kafka_bootstrap: str) -> None:
    names = [f"t-listed-{uuid.uuid4().hex[:8]}-{i}" for i in range(5)]

    created = kafka.ensure_topics(kafka_bootstrap, [kafka.TopicSpec(n, 6) for n in names])
    listed = kafka.producer(kafka_bootstrap).list_topics(timeout=10).topics  # a client of its own

    assert created == dict.fromkeys(names, "created")
    assert {n: sorted(p.leader >= 0 for p in listed[n].partitions.values()) for n in names} == {
        n: [True] * 6 for n in names
    }


def test_created_topics_answer_offset_requests_when_ensure_topics_returns(kafka_bootstrap: str) -> None:
    # What `txbridge admin` does right after `txbridge init`: one ListOffsets per partition, no retry.
    names = [f"t-serving-{uuid.uuid4().hex[:8]}-{i}" for i in range(5)]
    kafka.ensure_topics(kafka_bootstrap, [kafka.TopicSpec(n, 6) for n in names])
    consumer = kafka.consumer(kafka_bootstrap, f"g-{uuid.uuid4().hex[:8]}")
    try:
        ends = {
            (n, p): consumer.get_watermark_offsets(kafka.partition_at(n, p), timeout=10)
            for n in names
            for p in range(6)
        }
    finally:
        consumer.close()
    assert set(ends.values()) == {(0, 0)}


def test_native_transaction_visibility_and_markers(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    _commit_then_abort(kafka_bootstrap, topic)

    committed = read_topic(kafka_bootstrap, topic, isolation="read_committed")
    uncommitted = read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")

    assert [s.value for s in committed] == [b"committed-0", b"committed-1", b"committed-2"]
    assert [s.offset for s in committed] == [0, 1, 2]
    assert [s.value for s in uncommitted] == [
        b"committed-0",
        b"committed-1",
        b"committed-2",
        b"aborted-0",
        b"aborted-1",
    ]
    # The commit marker takes offset 3 and the abort marker offset 6.
    assert [s.offset for s in uncommitted] == [0, 1, 2, 4, 5]
    consumer = kafka.consumer(kafka_bootstrap, "watermarks")
    try:
        from confluent_kafka import TopicPartition

        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert (low, high) == (0, 7)


@pytest.mark.spark
def test_spark_kafka_source_reads_exactly_the_committed_records(
    kafka_bootstrap: str, topic_factory: Callable[..., str], spark
) -> None:
    topic = topic_factory()
    _commit_then_abort(kafka_bootstrap, topic)

    def values(isolation: str) -> list[str]:
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", isolation)
            .load()
        )
        return [r.value.decode() for r in frame.orderBy("offset").select("value").collect()]

    assert values("read_committed") == ["committed-0", "committed-1", "committed-2"]
    assert values("read_uncommitted") == [
        "committed-0",
        "committed-1",
        "committed-2",
        "aborted-0",
        "aborted-1",
    ]


def _cli(*args: str, cache: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**__import__("os").environ, "TXBRIDGE_CACHE": str(cache)},
    )
    return result, time.monotonic() - started


def test_cli_start_on_a_taken_port_says_what_to_change(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, elapsed = _cli(
            "kafka", "start", "--port", str(port), "--controller-port", str(free_port()), cache=tmp_path
        )

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"port {port}" in lines[0]
    assert "taken" in lines[0]
    assert "--port" in lines[0]
    assert elapsed < 15


def test_cli_pointed_at_nothing_says_what_to_change(tmp_path: Path) -> None:
    result, elapsed = _cli("kafka", "status", "--bootstrap", f"127.0.0.1:{free_port()}", cache=tmp_path)

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no Kafka broker answers" in lines[0]
    assert "--bootstrap" in lines[0]
    assert elapsed < 15


def test_broker_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path, port=free_port(), controller_port=free_port(), heap="not-a-size")

    started = time.monotonic()
    with pytest.raises(BrokerError, match="Invalid maximum heap size"):
        broker.start(timeout=30)
    assert time.monotonic() - started < 30
    assert not broker.status().running
