"""A producer process SIGKILLed between its half record and its op record, end to end:
the coordinator back-checks another live instance of the group, the barrier decides."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.kafka_helpers import read_topic
from txbridge import SqliteBarrier, TransactionProducer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _killed_producer(env: Env, group: str, topic: str, db: Path, when: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.producer.crash_producer",
            "--bootstrap",
            env.bootstrap,
            "--namespace",
            env.namespace,
            "--partitions",
            str(PARTITIONS),
            "--group",
            group,
            "--db",
            str(db),
            "--topic",
            topic,
            "--secret",
            SECRET,
            "--when",
            when,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr  # it really died by SIGKILL
    [line] = [x for x in done.stdout.splitlines() if x.startswith("tx=")]
    return line.removeprefix("tx=")


@pytest.mark.parametrize(("when", "visible"), [("after-local-commit", 1), ("before-local-commit", 0)])
def test_killed_producer_is_resolved_through_a_live_instance_of_its_group(
    env: Env,
    topic_factory: Callable[..., str],
    group_factory: Callable[[], str],
    tmp_path: Path,
    *,
    when: str,
    visible: int,
) -> None:
    topic = topic_factory()
    group = group_factory()
    db = tmp_path / "orders.db"
    handle = env.start(check_delay_s=1.0)
    tx_id = _killed_producer(env, group, topic, db, when)
    assert read_topic(env.bootstrap, topic) == []  # nothing before a decision

    barrier = SqliteBarrier(str(db))
    with TransactionProducer(
        env.bootstrap,
        group,
        secret=SECRET,
        check=barrier.check,
        namespace=env.namespace,
        partitions=PARTITIONS,
    ):
        # The dead instance's check URL refuses; the survivor's barrier answers.
        assert eventually(lambda: handle.service.stats["check_verdicts"] >= 1, timeout=60)
        time.sleep(1.0)  # a republish, if any, has committed by now
        seen = read_topic(env.bootstrap, topic)

    assert [s.headers["txb.tx"].decode() for s in seen] == [tx_id] * visible
    assert [s.value for s in seen] == [b"order"] * visible


def test_an_instance_on_another_database_is_never_asked_about_a_dead_writers_transaction(
    env: Env, topic_factory: Callable[..., str], group_factory: Callable[[], str], tmp_path: Path
) -> None:
    """Producer instances with databases of their own (the README's SqliteBarrier on two hosts).
    The writer commits its order and dies before its op record; the live instance's barrier has
    never seen the transaction, and would roll it back in its own database if asked. It is not
    asked: the transaction waits, visibly, for an instance on the writer's database."""
    topic = topic_factory()
    group = group_factory()
    writer_db, other_db = tmp_path / "orders-a.db", tmp_path / "orders-b.db"
    handle = env.start(check_delay_s=1.0, producer_liveness_s=5.0)
    tx_id = _killed_producer(env, group, topic, writer_db, "after-local-commit")

    other = SqliteBarrier(str(other_db))
    with TransactionProducer(
        env.bootstrap, group, secret=SECRET, check=other.check, namespace=env.namespace, partitions=PARTITIONS
    ):
        assert eventually(lambda: handle.service.stats["checks_awaiting_writer"] >= 3, timeout=60)
        assert read_topic(env.bootstrap, topic) == []
        assert handle.service.stats["check_verdicts"] == 0
        with sqlite3.connect(other_db) as db:
            assert db.execute("SELECT count(*) FROM txbridge_barrier").fetchone() == (0,)

        # An instance on the writer's database (its restart, or another host on it) answers.
        with TransactionProducer(
            env.bootstrap,
            group,
            secret=SECRET,
            check=SqliteBarrier(str(writer_db)).check,
            namespace=env.namespace,
            partitions=PARTITIONS,
        ):
            assert eventually(lambda: handle.service.stats["check_verdicts"] >= 1, timeout=60)
            time.sleep(1.0)  # a republish, if any, has committed by now

    seen = read_topic(env.bootstrap, topic)
    assert [s.headers["txb.tx"].decode() for s in seen] == [tx_id]
    with sqlite3.connect(other_db) as db:
        assert db.execute("SELECT count(*) FROM txbridge_barrier").fetchone() == (0,)
