"""A member joins the coordinators' group while SDK producers commit: the joiner's take-over runs
in its loop, after the poll whose rebalance callback was given the partitions, and a record
that poll returned of those partitions (fetched before the take-over placed them) is not
applied. What a read_committed consumer sees is checked against the barrier's committed rows.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.kafka_helpers import read_topic, wait_for
from txbridge import Message, SqliteBarrier, TransactionProducer, TxState, kafka

pytestmark = pytest.mark.integration

KEYS = 6


def _produce(
    env: Env, topic: str, barrier: SqliteBarrier, stop: threading.Event, errors: list[BaseException]
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
            "orders",
            secret=SECRET,
            check=barrier.check,
            namespace=env.namespace,
            partitions=PARTITIONS,
        ) as producer:
            i = 0
            while not stop.is_set():
                key = f"k{i % KEYS}"
                first = sequence[key]
                sequence[key] += 2
                producer.send_in_transaction(
                    [
                        Message(topic, f"{key}:{first}".encode(), key=key.encode()),
                        Message(topic, f"{key}:{first + 1}".encode(), key=key.encode()),
                    ],
                    commit,
                )
                i += 1
    except BaseException as exc:
        errors.append(exc)


def _committed(path: Path) -> set[str]:
    """The ground truth: the barrier's committed rows."""
    if not path.exists():
        return set()
    with sqlite3.connect(path) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'txbridge_barrier'").fetchone():
            return set()
        rows = conn.execute("SELECT tx_id FROM txbridge_barrier WHERE state = 'committed'").fetchall()
    return {row[0] for row in rows}


def _latest_half(env: Env, partition: int) -> Any:
    """The last record of a half partition, read from its end: a record the joiner's poll would
    have returned had the client fetched the partition before the take-over placed it."""
    peek = kafka.consumer(env.bootstrap, f"peek-{uuid.uuid4().hex[:8]}", isolation_level="read_uncommitted")
    try:
        low, high = peek.get_watermark_offsets(kafka.partition_at(env.topics.half, partition), timeout=10)
        peek.assign([kafka.partition_at(env.topics.half, partition, max(low, high - 20))])
        latest = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            batch = [m for m in peek.consume(100, 0.5) if m.error() is None]
            latest = next((m for m in reversed(batch) if m.offset() < high), latest)
            if not batch or batch[-1].offset() >= high - 1:
                break
        return latest
    finally:
        peek.close()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_joiner_takes_over_in_its_loop_and_applies_nothing_fetched_before(
    env: Env,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    protocol: str,
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    path = tmp_path / "orders.db"
    barrier = SqliteBarrier(str(path))
    settings: dict[str, Any] = {
        "static_membership": False,
        "check_delay_s": 600.0,
        "group_protocol": protocol,
    }
    stays = env.start(**settings)
    stop, errors = threading.Event(), []
    producer = threading.Thread(target=_produce, args=(env, topic, barrier, stop, errors), daemon=True)
    producer.start()

    # The joiner's polls: when one returns with partitions newly assigned, note what the joiner
    # serves and says of itself at that moment, and add to what the poll returned the latest
    # record of each such half partition, a second after its revocation: past its position,
    # with records between that a coordinator applying it would skip.
    seen_at_poll: list[tuple[set[int], set[int], bool]] = []  # (newly given, served, ready)
    real = kafka.consume_available

    def polled(client: Any, max_messages: int, timeout: float) -> list[Any]:
        service = env.running[-1].service if len(env.running) > 1 else None  # the joiner, once started
        clients = service.parts.kafka.clients if service is not None else None
        if clients is None or not clients.held() or clients.consumer() is not client:
            return real(client, max_messages, timeout)  # another coordinator's, or a reader's
        before = {(tp.topic, tp.partition) for tp in client.assignment()}
        records = real(client, max_messages, timeout)
        new = {(tp.topic, tp.partition) for tp in client.assignment()} - before
        given = sorted({n for t, n in new if t == env.topics.half})
        if given and service is not None:
            seen_at_poll.append((set(given), set(service.partitions), service.health.ready()))
            time.sleep(1.0)
            records = records + [m for m in (_latest_half(env, n) for n in given) if m is not None]
        return records

    monkeypatch.setattr(kafka, "consume_available", polled)
    try:
        assert eventually(lambda: len(_committed(path)) >= 20, timeout=30), "the producer commits nothing"
        joiner = env.start(wait=False, **settings)
        assert joiner.service.running.wait(60), "the joiner got no partitions"
        assert eventually(lambda: len(joiner.service.partitions) > 0, timeout=30)
        time.sleep(2.0)
        joiner.stop()
        assert eventually(lambda: len(stays.service.partitions) == PARTITIONS, timeout=30)
        time.sleep(1.0)
    finally:
        stop.set()
        producer.join(60)
    assert not errors, errors

    # The callback returned without taking anything over: when the poll returned, the joiner
    # served none of what it was just given and was not ready.
    assert seen_at_poll, "the joiner was given no partitions"
    for given, served, ready in seen_at_poll:
        assert not given & served, (given, served)
        assert not ready
    # What it was given was then taken over and served, and records were set aside as fetched
    # before the take-over (the ones added above).
    assert joiner.service.stats["stale_records"] > 0

    committed = _committed(path)
    wait_for(env.bootstrap, topic, 2 * len(committed), timeout=60)
    time.sleep(1.0)  # anything published twice would show now
    seen = read_topic(env.bootstrap, topic)
    published = Counter(s.headers["txb.tx"].decode() for s in seen)
    assert not committed - set(published), f"{len(committed - set(published))} committed never published"
    assert not {tx: n for tx, n in published.items() if n != 2}, "published more or less than once"
    assert set(published) == committed, "published transactions the barrier did not commit"
    values: dict[str, list[int]] = defaultdict(list)
    for record in sorted(seen, key=lambda s: (s.partition, s.offset)):
        key, _, number = (record.value or b"").decode().partition(":")
        values[key].append(int(number))
    for key, numbers in values.items():
        assert numbers == sorted(numbers), f"key {key} out of order"
