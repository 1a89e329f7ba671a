"""Issue 17: the demo's fourth path, Apache RocketMQ 5's transactional messages.

One bounded ``txbridge demo`` run through the CLI with all four paths (the demo starts its
own RocketMQ, in a temp cache, and stops it); its report is checked against an independent
count: a plain Kafka consumer or the RocketMQ watcher's record decoded with fastavro here,
and a SQL query on each path's table. Then the demo with RocketMQ skipped, and the errors a
user gets when RocketMQ is not there or cannot start.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from cli.main import main
from spark_pipelines import schema
from spark_pipelines.faults import Fault, FaultPlan
from spark_pipelines.paths.rocketmq_path import CHECKS_LOG, TRANSACTIONS_LOG
from spark_pipelines.report import load_metrics
from spark_pipelines.rocketmq import DEMO_TRANSACTION_SETTINGS, demo_rocketmq, start_local
from spark_pipelines.watcher import load_received
from spark_pipelines.workload import RunConfig
from tests.kafka_helpers import read_topic
from tests.pipelines.conftest import SMALL_DEMO_ORDERS, SmallDemo, demo_cache, run_demo
from txbridge.errors import BrokerError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.rocketmq]

ORDERS = 120


@dataclass
class DemoRun:
    result: Result
    run_dir: Path
    config: RunConfig
    plan: FaultPlan
    metrics: dict[tuple[str, str], dict[str, Any]]
    info: dict[str, Any]
    cache: Path
    seconds: float


def _load(result: Result, out: Path, cache: Path, seconds: float) -> DemoRun:
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    metrics, _samples, info = load_metrics(run_dir)
    config = RunConfig.load(run_dir)
    plan = FaultPlan.from_json(config.plan_file.read_text())
    rows = {(m.path, m.isolation): m.as_dict() for m in metrics}
    return DemoRun(result, run_dir, config, plan, rows, info, cache, seconds)


@pytest.fixture(scope="module")
def four_paths(
    kafka_bootstrap: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> DemoRun:
    """``txbridge demo`` with every path, every fault kind, the coordinator kill; no streaming, no
    Spark sinks' comparison (tests/pipelines/test_spark_sink_comparison.py)."""
    tmp = tmp_path_factory.mktemp("four-paths")
    cache = demo_cache(tmp)
    args = ["--orders", str(ORDERS), "--customers", "8", "--seed", "17", "--no-streaming", "--no-spark-sink"]
    result, seconds = run_demo(cache, tmp / "reports", "--bootstrap", kafka_bootstrap, *args)
    return _load(result, tmp / "reports", cache, seconds)


def _committed_rows(run: DemoRun, path: str) -> dict[str, tuple[str, int]]:
    engine = sa.create_engine(f"sqlite:///{run.run_dir / 'db' / f'{path}.sqlite'}")
    try:
        with engine.connect() as conn:
            query = sa.text(f"SELECT order_id, customer_id, customer_seq FROM orders_{path}")  # noqa: S608 - our path name
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    return {order_id: (customer, seq) for order_id, customer, seq in rows}


def _count(
    committed: dict[str, tuple[str, int]], values: Sequence[tuple[tuple[int, int], bytes]]
) -> dict[str, int]:
    """The report's numbers from ``((partition, offset), value)`` in read order and the DB rows."""
    ids: list[str] = []
    undecodable = 0
    firsts: dict[str, tuple[tuple[int, int], str, int]] = {}
    for position, value in values:
        try:
            event = schema.decode(value)
        except ValueError:
            undecodable += 1
            continue
        ids.append(event.order_id)
        firsts.setdefault(event.order_id, (position, event.customer_id, event.customer_seq))
    violations = 0
    highest: dict[str, int] = {}
    for _position, customer, seq in sorted(firsts.values()):
        if seq < highest.get(customer, 0):
            violations += 1
        highest[customer] = max(seq, highest.get(customer, 0))
    distinct = set(ids)
    return {
        "committed": len(committed),
        "records": len(values),
        "undecodable": undecodable,
        "delivered": len(distinct),
        "lost": len(committed.keys() - distinct),
        "phantom": len(distinct - committed.keys()),
        "duplicates": len(ids) - len(distinct),
        "order_violations": violations,
    }


def _independent_count(run: DemoRun, path: str, isolation: str) -> dict[str, int]:
    committed = _committed_rows(run, path)
    if path == "rocketmq":
        received = load_received(run.run_dir / "received-rocketmq.avro")
        return _count(committed, [((0, r.seq), r.body) for r in received])
    seen = read_topic(run.config.bootstrap, run.config.topics[path], isolation=isolation)
    return _count(committed, [((r.partition, r.offset), r.value or b"") for r in seen])


def test_the_demo_prints_and_reports_four_paths(four_paths: DemoRun) -> None:
    output = four_paths.result.output

    assert "txbridge vs Kafka transactions vs plain produce vs RocketMQ" in output
    assert f"{ORDERS} orders x 4 paths (txbridge, native, plain, rocketmq)" in output
    assert set(four_paths.metrics) == {
        *((p, i) for p in ("txbridge", "native", "plain") for i in ("read_committed", "read_uncommitted")),
        ("rocketmq", "read_committed"),
    }
    report = (four_paths.run_dir / "report.md").read_text()
    assert report.count("| rocketmq | read_committed |") == 1
    assert "## RocketMQ" in report
    for name in ("counts.png", "latency.png"):
        assert (four_paths.run_dir / name).stat().st_size > 0
    _metrics, samples, _info = load_metrics(four_paths.run_dir)
    # The latency chart draws every read_committed path that has samples: RocketMQ has them.
    assert (
        len(samples[("rocketmq", "read_committed")])
        == four_paths.metrics[("rocketmq", "read_committed")]["latency_n"]
    )
    print(f"four-path demo, {ORDERS} orders: {four_paths.seconds:.0f}s")


@pytest.mark.parametrize(
    ("path", "isolation"),
    [
        *((p, i) for p in ("txbridge", "native", "plain") for i in ("read_committed", "read_uncommitted")),
        ("rocketmq", "read_committed"),
    ],
)
def test_report_agrees_with_an_independent_count(four_paths: DemoRun, path: str, isolation: str) -> None:
    reported = four_paths.metrics[(path, isolation)]

    expected = _independent_count(four_paths, path, isolation)

    assert {k: reported[k] for k in expected} == expected


@pytest.mark.parametrize("path", ["txbridge", "native", "plain", "rocketmq"])
def test_every_path_handles_its_orders_at_the_paced_rate(four_paths: DemoRun, path: str) -> None:
    # Order i is handled no earlier than i / rate after the paths' common start; unpaced, a path
    # runs far ahead of that schedule. Slack: how late the path's first order was handled.
    rate = four_paths.config.rate
    assert rate == 10.0  # the demo's default
    index = {o.order_id: o.index for o in four_paths.plan.orders}
    store = four_paths.config.store(path)
    try:
        handled = sorted((index[o.order_id], o.committed_ms) for o in store.committed())
    finally:
        store.dispose()
    first_index, first_ms = handled[0]
    early = [i for i, ms in handled if ms < first_ms + (i - first_index) * 1000 / rate - 2000]
    assert early == []
    assert handled[-1][1] - first_ms >= (handled[-1][0] - first_index) * 1000 / rate - 2000


def test_the_report_splits_txbridges_latency_by_kind_of_order(four_paths: DemoRun) -> None:
    figures = four_paths.info["txbridge_latency"]
    kinds = ("prompt", "held_by_key", "back_checked")

    # Every committed txbridge order is in exactly one kind.
    assert figures["unsplit"] == 0
    committed = four_paths.metrics[("txbridge", "read_committed")]["committed"]
    assert sum(figures[kind]["orders"] for kind in kinds) == committed
    # Only a producer killed between its DB commit and its op record leaves the decision to a
    # back-check; an UNKNOWN outcome is settled by the producer itself (its barrier's check).
    assert figures["back_checked"]["orders"] == four_paths.plan.count(Fault.CRASH_AFTER_DB_COMMIT)
    # Its op record comes from the coordinator once the killed producer's heartbeats have been
    # silent for 2.5 intervals of 1 s (or after the check delay): seconds after the commit.
    assert figures["back_checked"]["producer"]["p50"] >= 1000
    report = (four_paths.run_dir / "report.md").read_text()
    assert "## Where txbridge's commit-to-visible time went" in report
    assert f"| prompt | {figures['prompt']['orders']} |" in report
    assert "txbridge's commit-to-visible p50 / p99 ms, by kind of order" in four_paths.result.output
    # `txbridge report` prints the same split again from metrics.json.
    again = CliRunner().invoke(main, ["report", str(four_paths.run_dir)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    prompt = re.search(
        r"prompt \(decided by its producer, not held back\): \d+ orders, whole [\d /]+ ms", again.output
    )
    assert prompt is not None, again.output
    assert prompt.group(0) in four_paths.result.output


def test_rocketmq_delivers_every_committed_order_and_no_rolled_back_one(four_paths: DemoRun) -> None:
    m = four_paths.metrics[("rocketmq", "read_committed")]
    plan = four_paths.plan
    # Orders that never committed: local failures and producers killed before the DB commit.
    assert m["committed"] == ORDERS - plan.count(Fault.LOCAL_FAIL) - plan.count(Fault.CRASH_AFTER_BEGIN)
    assert (m["lost"], m["phantom"], m["undecodable"]) == (0, 0, 0)
    assert m["delivered"] == m["committed"]
    assert m["latency_n"] == m["committed"]
    assert four_paths.info["settled"]["rocketmq"] is True


def test_every_open_rocketmq_transaction_was_checked_and_answered_from_the_database(
    four_paths: DemoRun,
) -> None:
    logs = four_paths.run_dir / "logs"
    ends = [json.loads(line) for line in (logs / TRANSACTIONS_LOG).read_text().splitlines()]
    checks = [json.loads(line) for line in (logs / CHECKS_LOG).read_text().splitlines()]
    committed = _committed_rows(four_paths, "rocketmq")
    faults = {o.index: o.fault for o in four_paths.plan.orders}
    left_open = [e for e in ends if e["end"] == "none"]
    answers: dict[str, set[str]] = {}
    for check in checks:
        answers.setdefault(check["message_id"], set()).add(check["answer"])

    assert sorted(faults[e["order"]] for e in left_open) == sorted(
        o.fault
        for o in four_paths.plan.orders
        if o.fault in (Fault.UNKNOWN, Fault.CRASH_AFTER_BEGIN, Fault.CRASH_AFTER_DB_COMMIT)
    )
    for end in left_open:
        verdict = "commit" if end["order_id"] in committed else "rollback"
        assert answers.get(end["message_id"]) == {verdict}, end
    facts = four_paths.info["rocketmq"]
    assert facts["open_never_checked"] == 0
    assert facts["checks"] == len(checks)
    assert facts["transaction_settings"] == DEMO_TRANSACTION_SETTINGS  # as the broker reports them
    assert facts["started_by_demo"] is True
    # Each order violation is either an order the check committed late or one overtaken.
    violations = four_paths.metrics[("rocketmq", "read_committed")]["order_violations"]
    assert sum(facts["order_violations_by_cause"].values()) == violations


def test_the_demo_stopped_its_rocketmq(four_paths: DemoRun) -> None:
    home = four_paths.cache / "rocketmq-demo"
    ports = json.loads((home / "rocketmq.json").read_text())

    assert not list(home.glob("*.pid"))
    assert f"127.0.0.1:{ports['grpc_port']}" == four_paths.info["rocketmq"]["endpoint"]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", ports["grpc_port"])) != 0


def test_skipping_rocketmq_runs_the_other_three_and_says_so(small_demo: SmallDemo) -> None:
    result = small_demo.result

    run = _load(result, small_demo.out, small_demo.cache, 0.0)
    # The three paths, and the Spark sinks' comparison (tests/pipelines/test_spark_sink_comparison.py)
    paths = {p for p, _ in run.metrics}
    assert paths == {"txbridge", "native", "plain", "spark-sink/kafka", "spark-sink/txbridge"}
    assert f"{SMALL_DEMO_ORDERS} orders x 3 paths (txbridge, native, plain)" in result.output
    assert "txbridge vs Kafka transactions vs plain produce" in result.output
    assert "**rocketmq was skipped** (left out with --paths)." in (run.run_dir / "report.md").read_text()
    assert not (small_demo.cache / "rocketmq-demo").exists()  # no RocketMQ was started


def test_an_existing_rocketmq_that_is_not_there_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        closed = holder.getsockname()[1]  # bound, not listening: nothing answers
        started = time.monotonic()
        result = CliRunner().invoke(
            main,
            ["demo", "--out", str(tmp_path), "--rocketmq-endpoint", f"127.0.0.1:{closed}"],
            env={"TXBRIDGE_CACHE": str(tmp_path)},
        )
        only_one = CliRunner().invoke(main, ["demo", "--rocketmq-namesrv", "127.0.0.1:9876"])
        unreachable = CliRunner().invoke(
            main,
            [
                "demo",
                "--rocketmq-endpoint",
                f"127.0.0.1:{closed}",
                "--rocketmq-namesrv",
                f"127.0.0.1:{closed}",
            ],
        )
        bad_paths = CliRunner().invoke(main, ["demo", "--paths", "txbridge,rabbitmq"])

    assert result.exit_code == 2
    assert "needs both --rocketmq-endpoint" in result.output
    assert only_one.exit_code == 2
    assert unreachable.exit_code == 2
    assert unreachable.output == (
        f"error: no RocketMQ proxy (gRPC) listens at 127.0.0.1:{closed} (--rocketmq-endpoint); start it, "
        "fix the address, or skip RocketMQ with --paths txbridge,native,plain\n"
    )
    assert bad_paths.exit_code == 2
    assert bad_paths.output.startswith(
        "error: --paths 'txbridge,rabbitmq': unknown path rabbitmq; choose from"
    )
    assert time.monotonic() - started < 10  # before anything was started
    assert not list(tmp_path.iterdir())


def test_a_rocketmq_that_cannot_start_is_an_error_naming_the_cause(tmp_path: Path) -> None:
    rocketmq = demo_rocketmq(tmp_path / "rocketmq", proxy_heap="16m")  # below the JVM's initial heap

    with pytest.raises(BrokerError) as caught:
        start_local(rocketmq, timeout=120)

    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith("the RocketMQ proxy exited with code 1 during start-up: ")
    assert "Initial heap size set to a larger value than the maximum heap size" in first_line
    assert first_line.endswith("; skip RocketMQ with --paths txbridge,native,plain")
    status = rocketmq.status()
    assert status.namesrv_pid is None  # the name server it had started is stopped again
    assert status.proxy_pid is None
    assert not list((tmp_path / "rocketmq").glob("*.pid"))
