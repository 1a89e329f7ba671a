"""The floor: only the Kafka I/O a committed txbridge message needs, with no txbridge logic.

Per message: produce a half record (idempotent, acks=all) and wait for its
acknowledgement, then produce the op record; a republisher process consumes
both (read_committed) and publishes the message to its real topic in Kafka
transactions, one per consumed batch, with its offsets. It is the best a Python
implementation of the protocol can reach on this machine; compare it with raw
produce to see what share of raw produce a transactional layer can reach at all.
:func:`floor_latency` times the same I/O open loop, commit to visible, next to txbridge's.

Run it on its own: ``python -m bench.floor --bootstrap 127.0.0.1:9092``.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from bench.kafka_native import NO_METER, CpuMeter, Figure, latency_figure, payload
from coordinator.service import fetch_settings
from txbridge import kafka
from txbridge.errors import TxBridgeError
from txbridge.kafka import TopicPartition
from txbridge.wire import H_TX

#: The cluster's client settings (librdkafka names), as ``txbridge bench --command-config`` gives them.
Extra = Mapping[str, Any] | None

if TYPE_CHECKING:
    from bench.txbridge_runs import Watcher

logger = logging.getLogger(__name__)

PARTITIONS = 12
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
#: The floor's republisher holds each Kafka transaction back this long after the previous
#: commit ended, gathering what arrives meanwhile. The coordinator holds none (group
#: commit), but at half load this is the better floor, a lower p50 than no gap
#: (docs/results/2026-11-27-lone-transaction.md).
FLOOR_COMMIT_GAP_S = 0.005


def produce_side(
    bootstrap: str, half: str, op: str, *, size: int, count: int, in_flight: int, extra: Extra = None
) -> tuple[float, float]:
    """Half, its ack, then op, for ``count`` messages with ``in_flight`` in flight.

    One thread, callbacks only (no futures, no event loop): the Python floor of the
    producer side. Returns ``(seconds, process CPU seconds)``.
    """
    producer = kafka.producer(bootstrap, extra)
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


def _republish(
    bootstrap: str,
    topics: tuple[str, str, str],
    ready: Any,
    stop: Any,
    commit_gap_s: float = 0.0,
    *,
    extra: Extra = None,
) -> None:
    """Consume half and op records; publish each committed message to ``real`` in a Kafka transaction.

    A transaction starts no sooner than ``commit_gap_s`` after the previous commit ended; the
    records that come meanwhile go into it.
    """
    half, op, real = topics
    # The coordinator's fetch settings: the same Kafka I/O, fetched the same way.
    consumer = kafka.consumer(
        bootstrap,
        f"floor-{uuid.uuid4().hex[:8]}",
        extra,
        **fetch_settings(),
    )
    consumer.assign([TopicPartition(t, p, 0) for t in (half, op) for p in range(PARTITIONS)])
    producer = kafka.producer(bootstrap, extra, transactional_id=f"floor-{uuid.uuid4().hex[:8]}", linger_ms=5)
    producer.init_transactions(30)
    halves: dict[bytes | None, bytes | None] = {}
    early_ops: set[bytes | None] = set()
    last_commit = 0.0
    ready.set()
    while not stop.is_set():
        batch = kafka.consume_available(consumer, 2000, 0.05)
        if not batch:
            continue
        while (wait := last_commit + commit_gap_s - time.monotonic()) > 0:
            batch += kafka.consume_available(consumer, 2000, wait)
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
        last_commit = time.monotonic()
    consumer.close()


@contextmanager
def _running_floor(
    bootstrap: str, commit_gap_s: float, extra: Extra = None
) -> Iterator[tuple[str, str, Watcher, int | None]]:
    """Fresh half/op/real topics, a republisher and a watcher of ``real``, both running.

    Yields ``(half, op, watcher, republisher's pid)``; stops both and deletes the topics on exit.
    """
    from bench.txbridge_runs import Watcher

    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}-"
    half, op, real = (f"{prefix}{name}" for name in ("half", "op", "real"))
    # Half and op keep LogAppendTime, as txbridge's do: the same broker work, and the op's
    # append time splits the floor's commit-to-visible as txbridge's is split.
    kafka.ensure_topics(
        bootstrap,
        [
            kafka.TopicSpec(half, PARTITIONS, APPEND_TIME),
            kafka.TopicSpec(op, PARTITIONS, APPEND_TIME),
            kafka.TopicSpec(real, 6),
        ],
        extra=extra,
    )
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    republisher = ctx.Process(
        target=_republish,
        args=(bootstrap, (half, op, real), ready, stop, commit_gap_s),
        kwargs={"extra": dict(extra or {})},
        daemon=True,
    )
    watcher = Watcher(bootstrap, real, extra).start()
    republisher.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the floor's republisher did not start")
        yield half, op, watcher, republisher.pid
    finally:
        stop.set()
        watcher.close()
        republisher.join(30)
        if republisher.is_alive():
            republisher.kill()
        try:
            kafka.delete_topics_with_prefix(bootstrap, prefix, extra=extra)
        except TxBridgeError as error:  # the figures stand; say what is left behind
            logger.warning("could not delete the floor's topics %s*: %s", prefix, error)


def floor(
    bootstrap: str,
    *,
    size: int,
    count: int,
    in_flight: int,
    meter: CpuMeter = NO_METER,
    extra: Extra = None,
) -> tuple[Figure, Figure]:
    """``(producer side only, end to end)`` figures of the floor, on fresh topics.

    ``extra``: the cluster's client settings (librdkafka names), for every client of the floor.
    """
    with _running_floor(bootstrap, commit_gap_s=0.0, extra=extra) as (half, op, watcher, republisher):
        # This process produces and reads (the watcher); with the republisher, the floor's
        # clients, set against txbridge's producers, reader and coordinator.
        clients = CpuMeter({"republisher": republisher, "producer_and_reader": os.getpid()})
        meter.start()
        clients.start()
        started = time.time()
        seconds, cpu = produce_side(
            bootstrap, half, op, size=size, count=count, in_flight=in_flight, extra=extra
        )
        if not watcher.wait(count, timeout=120):
            raise RuntimeError(f"only {len(watcher.seen)} of {count} floor messages became visible")
        used = {**meter.per_message(count), **clients.per_message(count)}
        elapsed = max(watcher.seen.values()) - started
    params: dict[str, object] = {"size": size, "count": count, "in_flight": in_flight}
    return (
        Figure(
            "floor: half, ack, op",
            count,
            seconds,
            {"msgs_per_s": count / seconds, "cpu_us_per_msg": cpu / count * 1e6},
            params,
        ),
        Figure("floor end to end", count, elapsed, {"msgs_per_s": count / elapsed, **used}, params),
    )


def produce_open_loop(
    bootstrap: str, half: str, op: str, *, size: int, rate: float, count: int, extra: Extra = None
) -> dict[str, float]:
    """Half, its ack, then op, for one message every ``1/rate`` s whatever the others do.

    Returns the wall time of each commit decision (its half acknowledged, its op not yet
    produced), by tx id.
    """
    producer = kafka.producer(bootstrap, extra)
    value = payload(size)
    committed: dict[str, float] = {}
    acked: list[None] = []  # one per op acknowledged

    def op_acked(err: Any, _msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"op record failed: {err}")
        acked.append(None)

    def half_acked(err: Any, msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"half record failed: {err}")
        committed[msg.key().decode()] = time.time()  # the decision: the op goes out after it
        producer.produce(op, b"COMMIT", msg.key(), msg.partition(), op_acked)

    for topic in (half, op):  # their metadata, before the clock (txbridge's producer is started too)
        producer.list_topics(topic, timeout=10)
    started = time.time()
    for i in range(count):
        # Serve acknowledgements (and so produce ops) until this message's send time.
        while (delay := started + i / rate - time.time()) > 0:
            producer.poll(min(delay, 0.005))
        tx = f"{i:032x}".encode()
        producer.produce(half, value, tx, i % PARTITIONS, half_acked, headers=[(H_TX, tx)])
        producer.poll(0)  # acknowledgements are served on time even when sends run late
    deadline = time.monotonic() + 60
    while len(acked) < count and time.monotonic() < deadline:
        producer.poll(0.01)
    if len(acked) < count:
        raise RuntimeError(f"only {len(acked)} of {count} floor op records were acknowledged")
    return committed


def floor_latency(
    bootstrap: str,
    *,
    size: int,
    rate: float,
    duration_s: float,
    extra: Extra = None,
    commit_gap_s: float = FLOOR_COMMIT_GAP_S,
    meter: CpuMeter = NO_METER,
) -> Figure:
    """Open-loop commit-to-visible latency of the floor, comparable with txbridge's at the same rate.

    The clock starts at the decision (the half acknowledged, before the op record is produced,
    as txbridge's starts when the local transaction returns COMMIT) and stops when a
    read_committed consumer sees the republished message. Each Kafka transaction starts ``commit_gap_s`` after
    the previous commit ended (:data:`FLOOR_COMMIT_GAP_S`; 0: as soon as something is ready, as
    the coordinator's group commit does). ``meter``'s processes' CPU over the open loop goes into
    the figure, per message, and so does the split of txbridge's figure
    (:func:`bench.txbridge_runs.latency_split`) at the same timestamps.

    Raises:
        BenchError: some committed messages never became visible.
    """
    from bench.txbridge_runs import latency_split, op_append_times

    total = max(1, int(rate * duration_s))
    with _running_floor(bootstrap, commit_gap_s=commit_gap_s, extra=extra) as (
        half,
        op,
        watcher,
        _,
    ):
        meter.start()
        committed = produce_open_loop(bootstrap, half, op, size=size, rate=rate, count=total, extra=extra)
        cpu = meter.per_message(total)
        watcher.wait(total, timeout=60)
        seen = dict(watcher.seen)
        appended = op_append_times(bootstrap, op, PARTITIONS, extra)
        split = latency_split(committed, appended, watcher.created, seen)
    figure = latency_figure(
        "floor commit-to-visible",
        committed,
        seen,
        expected=total,
        size=size,
        rate=rate,
        duration_s=duration_s,
    )
    figure.values.update(cpu)
    figure.values.update(split)
    return figure


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
