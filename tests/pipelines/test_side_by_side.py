"""Issue 4: the same faulty workload through txbridge, native transactions and plain produce.

The report's numbers are checked against an independent count: a plain
consumer (tests/kafka_helpers.read_topic), fastavro decoding in the test, and
a SQL query on each path's table (its SQLite file, or the PostgreSQL of --db-url).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from spark_pipelines import schema
from spark_pipelines.compare import measure, truth_frame
from spark_pipelines.faults import Fault
from spark_pipelines.report import load_metrics, table, write_report
from tests.kafka_helpers import read_topic
from tests.pipelines.conftest import SideBySide, db_file
from txbridge import kafka

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _committed_rows(run: SideBySide, path: str) -> dict[str, tuple[str, int]]:
    url = run.config.db_url or f"sqlite:///{db_file(run.config, path)}"
    table = f"orders_{run.config.run_id}_{path}" if run.config.db_url else f"orders_{path}"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sa.text(f"SELECT order_id, customer_id, customer_seq FROM {table}")  # noqa: S608 - run id and path are ours
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    return {order_id: (customer, seq) for order_id, customer, seq in rows}


def _independent_count(run: SideBySide, path: str, isolation: str) -> dict[str, int]:
    committed = _committed_rows(run, path)
    seen = read_topic(run.config.bootstrap, run.config.topics[path], isolation=isolation)
    ids: list[str] = []
    undecodable = 0
    firsts: dict[str, tuple[int, int, str, int]] = {}
    for record in seen:
        try:
            event = schema.decode(record.value or b"")
        except ValueError:
            undecodable += 1
            continue
        ids.append(event.order_id)
        firsts.setdefault(
            event.order_id, (record.partition, record.offset, event.customer_id, event.customer_seq)
        )
    violations = 0
    highest: dict[str, int] = {}
    for _p, _o, customer, seq in sorted(firsts.values()):
        if seq < highest.get(customer, 0):
            violations += 1
        highest[customer] = max(seq, highest.get(customer, 0))
    distinct = set(ids)
    return {
        "committed": len(committed),
        "records": len(seen),
        "undecodable": undecodable,
        "delivered": len(distinct),
        "lost": len(committed.keys() - distinct),
        "phantom": len(distinct - committed.keys()),
        "duplicates": len(ids) - len(distinct),
        "order_violations": violations,
    }


def test_every_fault_kind_happened_with_real_kills(side_by_side: SideBySide) -> None:
    plan = side_by_side.plan
    assert all(plan.count(kind) >= 1 for kind in Fault if kind is not Fault.NONE)
    crashes = plan.count(Fault.CRASH_AFTER_BEGIN) + plan.count(Fault.CRASH_AFTER_DB_COMMIT)
    for path in side_by_side.paths:
        result = side_by_side.workload.paths[path]
        assert len(result.crashes) == crashes
        assert result.processes == crashes + 1
        assert len(result.outcomes) == len(plan.orders)
    if "txbridge" in side_by_side.paths:
        assert side_by_side.workload.coordinator_kills == 1


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
@pytest.mark.parametrize("path", ["txbridge", "native", "plain"])
def test_report_agrees_with_a_plain_consumer_and_sql(
    side_by_side: SideBySide, path: str, isolation: str
) -> None:
    if path not in side_by_side.paths:
        pytest.skip("the txbridge producer SDK or coordinator is not in the tree yet")
    metrics = side_by_side.metric(path, isolation).as_dict()

    expected = _independent_count(side_by_side, path, isolation)

    assert {k: metrics[k] for k in expected} == expected


def test_txbridge_read_committed_is_exact(side_by_side: SideBySide) -> None:
    if "txbridge" not in side_by_side.paths:
        pytest.skip("the txbridge producer SDK or coordinator is not in the tree yet")
    m = side_by_side.metric("txbridge", "read_committed")

    assert m.committed > 0
    assert (m.lost, m.phantom, m.duplicates, m.undecodable) == (0, 0, 0, 0)
    assert m.delivered == m.committed
    assert m.latency_n == m.committed  # the watcher saw every one of them


def test_txbridge_read_committed_keeps_per_customer_order(side_by_side: SideBySide) -> None:
    if "txbridge" not in side_by_side.paths:
        pytest.skip("the txbridge producer SDK or coordinator is not in the tree yet")

    assert side_by_side.metric("txbridge", "read_committed").order_violations == 0


def test_native_and_plain_show_the_dual_write_gaps(side_by_side: SideBySide) -> None:
    plan = side_by_side.plan
    native = side_by_side.metric("native", "read_committed")
    native_dirty = side_by_side.metric("native", "read_uncommitted")
    plain = side_by_side.metric("plain", "read_committed")
    # Killed between the DB commit and the Kafka commit/send: committed orders without an event.
    assert native.lost == plan.count(Fault.CRASH_AFTER_DB_COMMIT)
    assert plain.lost == plan.count(Fault.CRASH_AFTER_DB_COMMIT)
    # A lost acknowledgement makes plain produce resend; native retries the same transaction.
    assert plain.duplicates == plan.count(Fault.UNKNOWN)
    assert native.duplicates == 0
    # read_uncommitted sees the records of aborted transactions: events for orders never committed.
    assert native.phantom == 0
    assert native_dirty.phantom == plan.count(Fault.LOCAL_FAIL) + plan.count(Fault.CRASH_AFTER_BEGIN)


def test_streaming_count_survives_a_restart(side_by_side: SideBySide) -> None:
    if "txbridge" not in side_by_side.paths:
        pytest.skip("the txbridge producer SDK or coordinator is not in the tree yet")
    per_customer = Counter(customer for customer, _ in _committed_rows(side_by_side, "txbridge").values())

    assert side_by_side.stream_starts == 2
    assert side_by_side.stream_counts == dict(per_customer)


def test_report_files_and_table(side_by_side: SideBySide, tmp_path: Path) -> None:
    info = {"run_id": side_by_side.config.run_id, "orders": len(side_by_side.plan.orders)}

    report = write_report(tmp_path, side_by_side.metrics, side_by_side.samples, info)

    assert report.read_text().count("| native |") == 2
    assert (tmp_path / "counts.png").stat().st_size > 0
    assert (tmp_path / "latency.png").stat().st_size > 0
    metrics, samples, loaded_info = load_metrics(tmp_path)
    assert metrics == side_by_side.metrics
    assert samples == side_by_side.samples
    assert loaded_info == info
    assert table(metrics).row_count == len(metrics)


def test_a_record_that_is_not_avro_is_counted_undecodable(
    kafka_bootstrap: str, topic_factory: Callable[..., str], spark
) -> None:
    topic = topic_factory()
    good = [schema.OrderCreated(f"o-{i}", "customer-1", i + 1, 100, 0) for i in range(2)]
    producer = kafka.producer(kafka_bootstrap)
    producer.produce(topic, key=b"customer-1", value=schema.encode(good[0]))
    producer.produce(topic, key=b"customer-1", value=b'{"order_id": "not avro"}')
    producer.produce(topic, key=b"customer-1", value=schema.encode(good[1]))
    assert producer.flush(15) == 0
    from spark_pipelines.store import CommittedOrder

    truth = truth_frame(
        spark, [CommittedOrder(e.order_id, e.customer_id, e.customer_seq, 100, 0) for e in good]
    )

    metrics, _ = measure(spark, kafka_bootstrap, "bad", topic, isolation="read_committed", truth=truth)

    assert (metrics.records, metrics.undecodable, metrics.delivered) == (3, 1, 2)
    assert (metrics.lost, metrics.phantom, metrics.duplicates) == (0, 0, 0)


def test_every_gap_and_the_latency_of_each_order_read_and_committed(
    kafka_bootstrap: str, topic_factory: Callable[..., str], spark
) -> None:
    """Each figure of a path from one topic: a lost, a phantom, a twice-read, a reordered and an
    undecodable record, and the latencies of the orders both committed and read."""
    from spark_pipelines.store import CommittedOrder

    topic = topic_factory(partitions=1)
    events = {i: schema.OrderCreated(f"o-{i}", "c", i, 100, 0) for i in range(1, 6)}
    producer = kafka.producer(kafka_bootstrap)
    for i in (1, 3, 2, 2, 5):  # o-4 never published; o-2 twice and after o-3; o-5 not committed
        producer.produce(topic, key=b"c", value=schema.encode(events[i]))
    producer.produce(topic, key=b"c", value=b"\x00not avro")
    assert producer.flush(15) == 0
    committed = {i: 1_000 * i for i in range(1, 5)}
    truth = truth_frame(spark, [CommittedOrder(f"o-{i}", "c", i, 100, at) for i, at in committed.items()])
    seen = {"o-1": 1_010, "o-2": 2_030, "o-3": 3_020, "o-5": 9_999}

    metrics, latencies = measure(
        spark, kafka_bootstrap, "gaps", topic, isolation="read_committed", truth=truth, visibility=seen
    )

    assert metrics.as_dict() | {"latency_p50_ms": None, "latency_p99_ms": None} == {
        "path": "gaps",
        "isolation": "read_committed",
        "committed": 4,
        "records": 6,
        "undecodable": 1,
        "delivered": 4,
        "lost": 1,
        "phantom": 1,
        "duplicates": 1,
        "order_violations": 1,
        "latency_n": 3,
        "latency_p50_ms": None,
        "latency_p99_ms": None,
    }
    assert latencies == [10, 20, 30]
