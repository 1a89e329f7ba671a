"""Issue 29: the demo's fifth comparison, Spark as the producer (Spark's Kafka sink vs txbridge's).

The session's small ``txbridge demo`` through the CLI (three paths, eight orders; shared with
tests/pipelines/test_rocketmq_path.py) with the comparison at its default size; the rows it
reports are checked against an independent count: a plain read_committed consumer of each
sink's output topic, decoded with fastavro here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_pipelines import schema
from spark_pipelines.report import load_metrics
from spark_pipelines.sink_compare import DEFAULT_ROWS
from spark_pipelines.workload import RunConfig
from tests.kafka_helpers import read_topic
from tests.pipelines.conftest import SmallDemo

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SINKS = ("spark-sink/kafka", "spark-sink/txbridge")


def _independent_count(bootstrap: str, topic: str, rows: int, run_id: str) -> dict[str, int]:
    """lost, duplicates and per-key reordered rows of ``topic`` against the rows the demo wrote."""
    seen = read_topic(bootstrap, topic, isolation="read_committed")
    ids: list[str] = []
    firsts: dict[str, tuple[int, int, str, int]] = {}
    for record in seen:
        event = schema.decode(record.value or b"")
        ids.append(event.order_id)
        first = (record.partition, record.offset, event.customer_id, event.customer_seq)
        firsts.setdefault(event.order_id, first)
    violations = 0
    highest: dict[str, int] = {}
    for _p, _o, customer, seq in sorted(firsts.values()):
        if seq < highest.get(customer, 0):
            violations += 1
        highest[customer] = max(seq, highest.get(customer, 0))
    expected = {f"{run_id}-sink-{i}" for i in range(rows)}
    return {
        "records": len(seen),
        "delivered": len(set(ids)),
        "lost": len(expected - set(ids)),
        "phantom": len(set(ids) - expected),
        "duplicates": len(ids) - len(set(ids)),
        "order_violations": violations,
    }


@pytest.fixture(scope="module")
def sink_demo(small_demo: SmallDemo) -> dict[str, Any]:
    """The session's small three-path demo: its Spark sinks' comparison at the default size."""
    result = small_demo.result
    assert result.exit_code == 0, result.output
    (run_dir,) = small_demo.out.iterdir()
    metrics, _samples, info = load_metrics(run_dir)
    return {
        "output": result.output,
        "run_dir": run_dir,
        "config": RunConfig.load(run_dir),
        "rows": {m.path: m.as_dict() for m in metrics if m.isolation == "read_committed"},
        "info": info,
        "seconds": small_demo.seconds,
    }


def test_both_sinks_are_in_metrics_and_agree_with_a_plain_consumer(sink_demo: dict[str, Any]) -> None:
    config: RunConfig = sink_demo["config"]
    rows = sink_demo["rows"]
    print(f"demo with the Spark sinks' comparison: {sink_demo['seconds']:.0f}s")

    for path in SINKS:
        topic = f"orders-{config.run_id}-sink-{path.rsplit('/', 1)[1]}"
        expected = _independent_count(config.bootstrap, topic, DEFAULT_ROWS, config.run_id)
        assert {k: rows[path][k] for k in expected} == expected, path
        assert rows[path]["committed"] == DEFAULT_ROWS


def test_txbridge_publishes_each_row_once_and_kafka_at_least_once(sink_demo: dict[str, Any]) -> None:
    rows = sink_demo["rows"]
    facts = sink_demo["info"]["spark_sink"]

    # Both faults happened to both sinks: the task failure (a marker each) and the driver kill.
    assert facts["task_failures"] == {"kafka": 1, "txbridge": 1}
    assert facts["driver_kills"] == 1
    txbridge = rows["spark-sink/txbridge"]
    assert (txbridge["lost"], txbridge["duplicates"], txbridge["order_violations"]) == (0, 0, 0)
    assert txbridge["delivered"] == DEFAULT_ROWS
    kafka = rows["spark-sink/kafka"]
    assert kafka["lost"] == 0
    # The killed driver's batch 1 had one task finished (its rows flushed to Kafka) when it died:
    # the restarted driver writes that batch again, so those rows come twice, every run. The
    # failed task's 20 rows usually come twice too, but its producer was not flushed.
    assert kafka["duplicates"] >= facts["rows_per_task_per_batch"] > 0
    assert kafka["phantom"] == 0


def test_the_report_and_the_terminal_show_the_sinks_beside_the_paths(sink_demo: dict[str, Any]) -> None:
    report = (Path(sink_demo["run_dir"]) / "report.md").read_text()
    output = sink_demo["output"]
    kafka = sink_demo["rows"]["spark-sink/kafka"]

    assert "plain produce vs Spark's Kafka sink vs Spark's txbridge sink" in output
    assert "## Spark as the producer" in report
    for path in SINKS:
        assert report.count(f"| {path} | read_committed |") == 1
    assert f"spark-sink/txbridge: of {DEFAULT_ROWS} rows, 0 lost, 0 duplicated, 0 reordered" in report
    assert f"spark-sink/kafka: of {DEFAULT_ROWS} rows, 0 lost, {kafka['duplicates']} duplicated" in report
    assert "is at-least-once" in report
    assert "publishes each row once" in report
    assert f"spark-sink/txbridge: of {DEFAULT_ROWS} rows, 0 lost, 0 duplicated" in output
    assert "spark-sink/kafka" in output
