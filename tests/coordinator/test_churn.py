"""Members joining and leaving the coordinators' group while SDK producers commit: what a
read_committed consumer sees against the barrier's committed rows.

Each join and each leave rebalances the group, and the member that stays up is revoked its
partitions while records are on their way to it. A record the loop holds when a revocation
runs inside ``consume()`` must neither be applied to a partition it no longer serves nor be
skipped past once the partition is given back (coordinator/group/rebalance.py, "kept").
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.kafka_helpers import read_topic, wait_for
from txbridge import Message, SqliteBarrier, TransactionProducer, TxState, kafka

pytestmark = pytest.mark.integration

PRODUCERS = 2
KEYS_PER_PRODUCER = 4
CHURNS = 4  # a member joins and leaves this many times: two rebalances each


def _produce(
    env: Env,
    topic: str,
    barrier: SqliteBarrier,
    label: str,
    *,
    stop: threading.Event,
    errors: list[BaseException],
) -> None:
    """Commit two-message transactions until ``stop``; each key's values count up."""

    def commit(txn: Any, _arg: Any) -> TxState:
        with barrier.local_transaction(txn.tx_id):
            pass
        return TxState.COMMIT

    sequence: Counter[str] = Counter()
    try:
        with TransactionProducer(
            env.bootstrap,
            f"orders-{label}",
            secret=SECRET,
            check=barrier.check,
            namespace=env.namespace,
            partitions=PARTITIONS,
        ) as producer:
            i = 0
            while not stop.is_set():
                key = f"{label}-k{i % KEYS_PER_PRODUCER}"
                first, second = sequence[key], sequence[key] + 1
                sequence[key] += 2
                producer.send_in_transaction(
                    [
                        Message(topic, f"{key}:{first}".encode(), key=key.encode()),
                        Message(topic, f"{key}:{second}".encode(), key=key.encode()),
                    ],
                    commit,
                )
                i += 1
    except BaseException as exc:
        errors.append(exc)


def _descheduled_after_poll(client: Any, max_messages: int, timeout: float) -> list[Any]:
    """:func:`txbridge.kafka.consume_available`, with the loop's thread held up for a moment
    between ``poll()`` returning a record and ``consume()`` taking the rest, as a loaded host's
    scheduler (or another thread holding the GIL) does: a revocation that arrives meanwhile runs
    inside ``consume()``, before the loop has taken that record."""
    first = client.poll(timeout)
    if first is None:
        return []
    time.sleep(0.02)
    return [first, *client.consume(max_messages - 1, 0)]


def _group(env: Env, group: str) -> tuple[str, str, list[tuple[set[int], set[int]]]]:
    """The group's protocol (``classic``/``consumer``), its assignor, and each member's half and
    op partition numbers."""
    admin = kafka.admin(env.bootstrap)  # held while the future is awaited
    described = admin.describe_consumer_groups([group])[group].result(10)
    members = []
    for member in described.members:
        held = member.assignment.topic_partitions if member.assignment else []
        members.append(
            (
                {tp.partition for tp in held if tp.topic == env.topics.half},
                {tp.partition for tp in held if tp.topic == env.topics.op},
            )
        )
    return described.type.name.lower(), described.partition_assignor, members


def _committed(path: Path) -> set[str]:
    """The ground truth: the barrier's committed rows."""
    if not path.exists():
        return set()
    with sqlite3.connect(path) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'txbridge_barrier'").fetchone():
            return set()
        rows = conn.execute("SELECT tx_id FROM txbridge_barrier WHERE state = 'committed'").fetchall()
    return {row[0] for row in rows}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_members_joining_and_leaving_under_load_lose_and_repeat_nothing(
    env: Env,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    protocol: str,
) -> None:
    monkeypatch.setattr(kafka, "consume_available", _descheduled_after_poll)
    topic = topic_factory(partitions=PARTITIONS)
    path = tmp_path / "orders.db"
    barrier = SqliteBarrier(str(path))
    # No back-check within the test: a record skipped by the loop is not made good by one.
    settings: dict[str, Any] = {
        "static_membership": False,
        "check_delay_s": 600.0,
        "group_protocol": protocol,
    }
    stays = env.start(**settings)
    stop, errors = threading.Event(), []
    producers = [
        threading.Thread(
            target=_produce,
            args=(env, topic, barrier, f"p{n}"),
            kwargs={"stop": stop, "errors": errors},
            daemon=True,
        )
        for n in range(PRODUCERS)
    ]
    for thread in producers:
        thread.start()
    try:
        assert eventually(lambda: len(_committed(path)) >= 20, timeout=30), "the producers commit nothing"
        for _ in range(CHURNS):
            joiner = env.start(**settings)
            assert eventually(lambda j=joiner: len(j.service.partitions) > 0, timeout=30)
            kind, assignor, members = _group(env, stays.service.config.group_id)
            assert (kind, assignor) == (protocol, "range")
            # Co-partitioned: partition i of half and op on one member, whichever assigns.
            assert all(half == op for half, op in members), members
            time.sleep(1.0)
            joiner.stop()
            assert eventually(lambda: len(stays.service.partitions) == PARTITIONS, timeout=30)
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in producers:
            thread.join(60)
    assert not errors, errors
    if protocol == "classic":
        # The member that stayed served partitions on from memory across the eager rebalances:
        # the path the test is about was taken. (The consumer protocol moves only what moves.)
        assert stays.service.stats["partitions_kept"] > 0

    committed = _committed(path)
    seen = wait_for(env.bootstrap, topic, 2 * len(committed), timeout=60)
    time.sleep(1.0)  # anything published twice would show now
    seen = read_topic(env.bootstrap, topic)
    published = Counter(s.headers["txb.tx"].decode() for s in seen)
    missing = committed - set(published)
    repeated = {tx: n for tx, n in published.items() if n != 2}
    assert not missing, f"{len(missing)} of {len(committed)} committed transactions never published"
    assert not repeated, f"transactions published more or less than once: {repeated}"
    assert set(published) == committed, "published transactions the barrier did not commit"
    values: dict[str, list[int]] = defaultdict(list)
    for record in sorted(seen, key=lambda s: (s.partition, s.offset)):
        key, _, number = (record.value or b"").decode().partition(":")
        values[key].append(int(number))
    for key, numbers in values.items():
        assert numbers == sorted(numbers), f"key {key} out of order"
