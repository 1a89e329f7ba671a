"""examples/barrier_sqlite.py runs against the broker (the coordinator's e2e test adds republishing).

Its topic does not exist beforehand: the example creates it (the producer refuses a missing topic).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kafka_helpers import read_topic
from txbridge import kafka
from txbridge.wire import DEFAULT_PARTITIONS, Topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_barrier_sqlite_example(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    namespace_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    namespace = namespace_factory(DEFAULT_PARTITIONS, prefix="exns_")  # the example uses the default
    db = tmp_path / "orders.db"
    topic = unique_name("orders")
    options = [
        "--bootstrap",
        kafka_bootstrap,
        "--db",
        str(db),
        "--namespace",
        namespace,
        "--topic",
        topic,
    ]
    completed = subprocess.run(
        [sys.executable, "examples/barrier_sqlite.py", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    created, outcome = completed.stdout.splitlines()
    assert created == f"created topic {topic}"
    assert ": COMMIT (partition" in outcome
    tx_id = outcome.split()[1].rstrip(":")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT state FROM txbridge_barrier WHERE tx_id = ?", (tx_id,)).fetchall() == [
            ("committed",)
        ]
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    ops = [json.loads(r.value or b"") for r in read_topic(kafka_bootstrap, Topics(namespace).op)]
    assert [(o["tx"], o["state"], o["count"]) for o in ops] == [(tx_id, "COMMIT", 1)]


def test_create_topic_creates_once(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("TopicTest")
    argv = [
        sys.executable,
        "examples/create_topic.py",
        topic,
        "--partitions",
        "3",
        "--bootstrap",
        kafka_bootstrap,
    ]

    outputs = [
        subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
        for _ in range(2)
    ]

    assert outputs == [f"created  {topic}\n", f"exists   {topic}\n"]
    found = kafka.admin(kafka_bootstrap).list_topics(timeout=10).topics[topic]
    assert len(found.partitions) == 3
