"""A producer killed between its half records and its op record: the barrier decides the back-check."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.kafka_helpers import read_topic
from txbridge import SqliteBarrier, TransactionProducer, TxState, wire
from txbridge.errors import BarrierConflictError
from txbridge.wire import CheckMessage, CheckRequest, Topics

from .conftest import PARTITIONS, SECRET

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def crash(kafka_bootstrap: str, namespace: str, group: str, db: Path, *, when: str, topic: str) -> str:
    args = {
        "bootstrap": kafka_bootstrap,
        "namespace": namespace,
        "partitions": str(PARTITIONS),
        "group": group,
        "db": str(db),
        "topic": topic,
        "secret": SECRET.decode(),
        "when": when,
    }
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.producer.crash_producer",
            *(x for k, v in args.items() for x in (f"--{k}", v)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == -9, completed.stderr
    [line] = [x for x in completed.stdout.splitlines() if x.startswith("tx=")]
    return line.removeprefix("tx=")


def ask(producer: TransactionProducer, tx_id: str, instance: str) -> TxState:
    request = CheckRequest(
        tx_id, producer.settings.group, instance, 1, (CheckMessage("orders", b"customer-1"),)
    )
    body = request.encode()
    response = httpx.post(
        producer.check_url, content=body, headers={wire.SIGNATURE_HEADER: wire.sign(SECRET, body)}, timeout=30
    )
    return wire.decode_check_answer(response.status_code, response.content)


@pytest.mark.parametrize(
    ("when", "verdict", "order_rows"),
    [("after-local-commit", TxState.COMMIT, 1), ("before-local-commit", TxState.ROLLBACK, 0)],
)
def test_killed_producer_leaves_halves_and_a_decisive_check(
    kafka_bootstrap: str,
    namespace: str,
    *,
    topics: Topics,
    group_factory: Callable[[], str],
    make_producer: Callable[..., TransactionProducer],
    tmp_path: Path,
    when: str,
    verdict: TxState,
    order_rows: int,
    orders: str,
) -> None:
    group = group_factory()
    db = tmp_path / "orders.db"
    tx_id = crash(kafka_bootstrap, namespace, group, db, when=when, topic=orders)

    halves = [r for r in read_topic(kafka_bootstrap, topics.half) if r.key == tx_id.encode()]
    assert len(halves) == 1
    assert [r for r in read_topic(kafka_bootstrap, topics.op) if r.key == tx_id.encode()] == []
    crashed = halves[0].headers["txb.instance"].decode()
    # The dead instance never wrote its tombstone: its last heartbeat is still the registry's word.
    registry = [
        r for r in read_topic(kafka_bootstrap, topics.producers) if r.key == f"{group}/{crashed}".encode()
    ]
    assert registry
    assert registry[-1].value is not None
    assert json.loads(registry[-1].value)["instance"] == crashed

    # Another instance of the group, on the same database, answers the back-check.
    barrier = SqliteBarrier(db)
    survivor = make_producer(group=group, check=barrier.check)
    assert ask(survivor, tx_id, crashed) is verdict
    assert ask(survivor, tx_id, crashed) is verdict  # the first verdict stays
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (order_rows,)
    if verdict is TxState.ROLLBACK:
        with pytest.raises(BarrierConflictError), barrier.local_transaction(tx_id):
            pass  # a late local commit is refused
