"""The floor: only the Kafka I/O a committed txbridge message needs, with no txbridge logic.

Per message: produce a half record (idempotent, acks=all) and wait for its
acknowledgement, then produce the op record; a republisher process consumes
both (read_committed) and publishes the message to its real topic in Kafka
transactions, one per consumed batch, with its offsets. It is the best a Python
implementation of the protocol can reach on this machine; compare it with raw
produce to see what share of raw produce a transactional layer can reach at all.

Run it on its own: ``python -m txbridge.bench.floor --bootstrap 127.0.0.1:9092``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import uuid
from typing import Any

from confluent_kafka import TopicPartition

from txbridge import _kafka
from txbridge.bench.kafka_native import Figure, payload
from txbridge.wire import H_TX

PARTITIONS = 12


def produce_side(
    bootstrap: str, half: str, op: str, *, size: int, count: int, in_flight: int
) -> tuple[float, float]:
    """Half, its ack, then op, for ``count`` messages with ``in_flight`` in flight.

    One thread, callbacks only (no futures, no event loop): the Python floor of the
    producer side. Returns ``(seconds, process CPU seconds)``.
    """
    producer = _kafka.producer(bootstrap)
    value = payload(size)
    state = {"sent": 0, "acked": 0, "done": 0}

    def op_acked(err: Any, _msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"op record failed: {err}")
        state["done"] += 1

    def half_acked(err: Any, msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"half record failed: {err}")
        producer.produce(op, b"COMMIT", msg.key(), msg.partition(), op_acked)

    cpu, started = time.process_time(), time.perf_counter()
    while state["done"] < count:
        while state["sent"] < count and state["sent"] - state["done"] < in_flight:
            i = state["sent"]
            tx = f"{i:032x}".encode()
            producer.produce(half, value, tx, i % PARTITIONS, half_acked, headers=[(H_TX, tx)])
            state["sent"] += 1
        producer.poll(0.001)
    return time.perf_counter() - started, time.process_time() - cpu


def _republish(bootstrap: str, topics: tuple[str, str, str], ready: Any, stop: Any) -> None:
    """Consume half and op records; publish each committed message to ``real`` in a Kafka transaction."""
    half, op, real = topics
    consumer = _kafka.consumer(bootstrap, f"floor-{uuid.uuid4().hex[:8]}", fetch_wait_max_ms=5)
    consumer.assign([TopicPartition(t, p, 0) for t in (half, op) for p in range(PARTITIONS)])
    producer = _kafka.producer(bootstrap, transactional_id=f"floor-{uuid.uuid4().hex[:8]}", linger_ms=5)
    producer.init_transactions(30)
    halves: dict[bytes | None, bytes | None] = {}
    early_ops: set[bytes | None] = set()
    ready.set()
    while not stop.is_set():
        batch = _kafka.consume_available(consumer, 2000, 0.05)
        if not batch:
            continue
        producer.begin_transaction()
        for msg in batch:
            if msg.error() is not None:
                continue
            key = msg.key()
            if msg.topic() == half:
                halves[key] = msg.value()
                if key in early_ops:  # its op was consumed first (another partition's fetch)
                    early_ops.discard(key)
                    producer.produce(real, halves.pop(key), key, headers=[(H_TX, key)])
            elif key in halves:
                producer.produce(real, halves.pop(key), key, headers=[(H_TX, key)])
            else:
                early_ops.add(key)
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    consumer.close()


def floor(bootstrap: str, *, size: int, count: int, in_flight: int) -> tuple[Figure, Figure]:
    """``(producer side only, end to end)`` figures of the floor, on fresh topics."""
    from txbridge.bench.txbridge_runs import Watcher

    run = uuid.uuid4().hex[:8]
    half, op, real = (f"bench-floor-{run}-{name}" for name in ("half", "op", "real"))
    _kafka.ensure_topics(
        bootstrap,
        [_kafka.TopicSpec(half, PARTITIONS), _kafka.TopicSpec(op, PARTITIONS), _kafka.TopicSpec(real, 6)],
    )
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    republisher = ctx.Process(target=_republish, args=(bootstrap, (half, op, real), ready, stop), daemon=True)
    watcher = Watcher(bootstrap, real).start()
    republisher.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the floor's republisher did not start")
        started = time.time()
        seconds, cpu = produce_side(bootstrap, half, op, size=size, count=count, in_flight=in_flight)
        if not watcher.wait(count, timeout=120):
            raise RuntimeError(f"only {len(watcher.seen)} of {count} floor messages became visible")
        elapsed = max(watcher.seen.values()) - started
    finally:
        stop.set()
        watcher.close()
        republisher.join(30)
    params: dict[str, object] = {"size": size, "count": count, "in_flight": in_flight}
    return (
        Figure(
            "floor: half, ack, op",
            count,
            seconds,
            {"msgs_per_s": count / seconds, "cpu_us_per_msg": cpu / count * 1e6},
            params,
        ),
        Figure("floor end to end", count, elapsed, {"msgs_per_s": count / elapsed}, params),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--count", type=int, default=30_000)
    parser.add_argument("--in-flight", type=int, default=256)
    args = parser.parse_args()
    for figure in floor(args.bootstrap, size=args.size, count=args.count, in_flight=args.in_flight):
        values = ", ".join(f"{k} = {v:,.1f}" for k, v in figure.values.items())
        print(f"{figure.name}: {values}")


if __name__ == "__main__":
    main()
