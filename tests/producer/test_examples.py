"""examples/barrier_sqlite.py runs against the broker (the coordinator's e2e test adds republishing)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kafka_helpers import read_topic
from txbridge.topics import init_topics
from txbridge.wire import Topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_barrier_sqlite_example(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    namespace = unique_name("exns").replace("-", "_")
    init_topics(kafka_bootstrap, namespace)  # the example uses the default 12 partitions
    db = tmp_path / "orders.db"
    options = [
        "--bootstrap",
        kafka_bootstrap,
        "--db",
        str(db),
        "--namespace",
        namespace,
        "--topic",
        "orders-x",
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
    assert ": COMMIT (partition" in completed.stdout
    tx_id = completed.stdout.split()[1].rstrip(":")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT state FROM txbridge_barrier WHERE tx_id = ?", (tx_id,)).fetchall() == [
            ("committed",)
        ]
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    ops = [json.loads(r.value or b"") for r in read_topic(kafka_bootstrap, Topics(namespace).op)]
    assert [(o["tx"], o["state"], o["count"]) for o in ops] == [(tx_id, "COMMIT", 1)]
