"""txbridge's own figures: end-to-end throughput, commit-to-visible latency, back-check drain,
coordinator memory and failover. Each runs against real coordinator processes."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import random
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kafka_native import (
    NO_METER,
    BenchError,
    CpuMeter,
    Figure,
    latency_figure,
    payload,
    percentile,
)
from coordinator.commit import changelog
from servers.broker import free_port
from servers.coordinator_process import CoordinatorProcess
from txbridge import kafka
from txbridge.aio import AsyncTransactionProducer
from txbridge.barrier import SqliteBarrier
from txbridge.client_config import ClientConfig
from txbridge.kafka import OFFSET_END, TopicPartition
from txbridge.topics import init_topics
from txbridge.transaction import LocalTransaction, Message
from txbridge.wire import (
    H_TX,
    Topics,
    TxState,
    half_partition,
    header_dict,
    op_tx_ids,
    partition_transactional_id,
)

PARTITIONS = 12
#: The failover steps kill at a random moment within this much after their first 2 s of load:
#: at least one heartbeat interval of the coordinators (0.5 s), so the
#: kill falls anywhere in their heartbeat cycle, on which the takeover depends.
KILL_SPREAD_S = 2.0


def default_producers() -> int:
    """Producer processes for the end-to-end run: one per four cores, at least one.

    One asyncio producer process keeps about one core busy at saturation; the broker, the
    coordinator and the visibility watcher need the others (on 2 cores a second producer
    process only takes CPU from them).
    """
    return max(1, (os.cpu_count() or 1) // 4)


@dataclass
class Env:
    """What every txbridge run shares: the broker, a namespace, a secret, a folder for logs."""

    bootstrap: str
    run_id: str
    work: Path
    secret: str = field(default_factory=lambda: os.urandom(16).hex())
    #: Producer processes of the end-to-end run (``txbridge bench --producers``).
    producers: int = field(default_factory=default_producers)
    #: The cluster's client settings (``txbridge bench --command-config``), for every client.
    client: ClientConfig = field(default_factory=ClientConfig)

    @property
    def extra(self) -> dict[str, Any]:
        """:attr:`client` as librdkafka settings."""
        return self.client.librdkafka()

    @property
    def topic_prefixes(self) -> tuple[str, str]:
        """Every topic this run creates starts with one of these."""
        return f"__txb_bench_{self.run_id}_", f"bench-{self.run_id}-"

    def namespace(self, name: str) -> str:
        ns = f"{self.topic_prefixes[0]}{name}"
        init_topics(self.bootstrap, ns, PARTITIONS, client_config=self.client)
        return ns

    def topic(self, name: str, partitions: int = 6) -> str:
        topic = f"{self.topic_prefixes[1]}{name}"
        kafka.ensure_topics(self.bootstrap, [kafka.TopicSpec(topic, partitions)], extra=self.extra)
        return topic

    def delete_topics(self) -> list[str]:
        """Delete every topic this run created (a full run's are many partitions and much data)."""
        return [
            name
            for prefix in self.topic_prefixes
            for name in kafka.delete_topics_with_prefix(self.bootstrap, prefix, extra=self.extra)
        ]

    def coordinator(self, ns: str, name: str, *args: str) -> CoordinatorProcess:
        return CoordinatorProcess(
            self.bootstrap,
            ns,
            secret=self.secret,
            log_path=self.work / f"{name}.log",
            args=(*args, *self.client.cli_args()),
        )

    def producer(
        self, ns: str, group: str, check: Callable[[LocalTransaction], TxState]
    ) -> AsyncTransactionProducer:
        return AsyncTransactionProducer(
            self.bootstrap,
            group,
            secret=self.secret,
            check=check,
            namespace=ns,
            partitions=PARTITIONS,
            client_config=self.client,
        )


class Watcher:
    """A read_committed consumer in a process of its own, from the end of ``topic``.

    It records the wall time each tx id is first seen. Its own process keeps the
    producer's GIL out of the visibility timestamps.
    """

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, Any] | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.seen: dict[str, float] = {}
        #: tx id -> its record's CreateTime (s): the coordinator's produce(), for the split
        self.created: dict[str, float] = {}
        self._queue: Any = ctx.Queue()
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_watch,
            args=(bootstrap, topic, self._queue, self._stop, self._ready),
            kwargs={"extra": dict(extra or {})},
        )
        self._drain = threading.Thread(target=self._collect, daemon=True)

    def start(self) -> Watcher:
        self._proc.start()
        if not self._ready.wait(60):
            raise BenchError("the visibility watcher did not start")
        self._drain.start()
        return self

    def _collect(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            for tx, seen, created in batch:
                if tx not in self.seen:
                    self.seen[tx] = seen
                    self.created[tx] = created

    def wait(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.seen) >= count

    def close(self) -> None:
        """Stop the watcher; also one whose :meth:`start` failed or never came."""
        self._stop.set()
        if self._drain.ident is not None:
            self._drain.join(15)
        if self._proc.pid is None:
            return
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()


def _watch(
    bootstrap: str, topic: str, out: Any, stop: Any, ready: Any, *, extra: Mapping[str, Any] | None = None
) -> None:
    consumer = kafka.consumer(bootstrap, f"bench-watch-{os.urandom(4).hex()}", extra, fetch_wait_max_ms=10)
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in parts])
    consumer.consume(1, 0.5)  # resolves OFFSET_END before anything is produced
    ready.set()
    try:
        while not stop.is_set():
            batch = []
            for msg in kafka.consume_available(consumer, 1000, 0.1):
                if msg.error() is None:
                    now = time.time()
                    tx = header_dict(msg.headers()).get(H_TX)
                    if tx:
                        batch.append((tx.decode(), now, msg.timestamp()[1] / 1000))
            if batch:
                out.put(batch)
    finally:
        out.put(None)
        consumer.close()


def _always(state: TxState) -> Callable[[LocalTransaction, object], TxState]:
    return lambda _txn, _arg: state


async def _send_many(
    producer: AsyncTransactionProducer,
    messages: Iterable[Message],
    concurrency: int,
    execute: Callable[[LocalTransaction, object], TxState],
    done: dict[str, float],
) -> None:
    """Send every message in its own transaction, ``concurrency`` of them in flight.

    ``concurrency`` workers share the iterator: no task or semaphore per message, so the
    driver's own cost stays out of the producer's figures.
    """
    pending = iter(messages)

    async def worker() -> None:
        for message in pending:
            result = await producer.send_in_transaction(message, execute)
            if result.error is not None and result.state is TxState.ROLLBACK:
                raise BenchError(f"a transaction failed: {result.error}")
            done[result.tx_id] = time.time()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def end_to_end(
    env: Env, ns: str, *, size: int, count: int, concurrency: int, meter: CpuMeter = NO_METER
) -> Figure:
    """Saturated throughput: ``count`` committed transactions, counted visible on the real topic.

    ``env.producers`` producer processes share the transactions and ``concurrency`` (the
    transactions in flight, in total); the clock starts once every producer is started.
    """
    topic = env.topic("e2e")
    producers = max(1, min(env.producers, count))
    watcher = Watcher(env.bootstrap, topic, env.extra).start()
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    ready: Any = ctx.Queue()
    shares = [
        _E2EShare(env, ns, topic, size, range(k, count, producers), max(1, concurrency // producers))
        for k in range(producers)
    ]
    procs = [ctx.Process(target=_e2e_producer, args=(share, ready, go), daemon=True) for share in shares]
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            error = ready.get(timeout=120)
            if error:
                raise BenchError(f"an end-to-end producer did not start: {error}")
        # This process (the watcher's reader) and the producers' (each says its own, as it ends),
        # set against the floor's clients.
        clients = CpuMeter({"reader": os.getpid()})
        meter.start()
        clients.start()
        started = time.time()
        go.set()
        for proc in procs:
            proc.join()
        failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
        if failed:
            raise BenchError(f"{len(failed)} end-to-end producer processes failed (exit codes {failed})")
        if not watcher.wait(count, timeout=120):
            raise BenchError(f"only {len(watcher.seen)} of {count} committed messages became visible")
        sending = sum(float(ready.get(timeout=30)) for _ in procs)
        cpu = {**meter.per_message(count), **clients.per_message(count)}
        cpu["producers_cpu_us_per_msg"] = sending / count * 1e6
        last = max(watcher.seen.values())
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        watcher.close()
    elapsed = last - started
    return Figure(
        "txbridge end to end",
        count,
        elapsed,
        {"msgs_per_s": count / elapsed, "mb_per_s": count * size / elapsed / 1e6, **cpu},
        {"size": size, "count": count, "concurrency": concurrency, "producers": producers},
    )


@dataclass(frozen=True)
class _E2EShare:
    """One producer process's part of the end-to-end run (picklable, for a spawned process)."""

    env: Env
    ns: str
    topic: str
    size: int
    indexes: range
    in_flight: int


def _e2e_producer(share: _E2EShare, ready: Any, go: Any) -> None:
    """A producer process: start, say so, wait for the go, send its share of transactions, then
    put the CPU seconds the sending took (all its threads: librdkafka's too) on ``ready``."""

    async def main() -> None:
        value = payload(share.size)
        try:
            producer = share.env.producer(share.ns, "bench-e2e", lambda _t: TxState.COMMIT)
            await producer.start()
        except BaseException as exc:
            ready.put(f"{type(exc).__name__}: {exc}")
            raise
        try:
            ready.put("")
            await asyncio.to_thread(go.wait)
            began = time.process_time()
            msgs = (Message(share.topic, value, key=str(i % 4096).encode()) for i in share.indexes)
            await _send_many(producer, msgs, share.in_flight, _always(TxState.COMMIT), {})
            ready.put(time.process_time() - began)
        finally:
            await producer.close()

    asyncio.run(main())


def latency(
    env: Env, ns: str, *, size: int, rate: float, duration_s: float, meter: CpuMeter = NO_METER
) -> Figure:
    """Open-loop: a transaction starts every 1/rate s whatever the others do; commit-to-visible.

    The clock starts when the local transaction returns COMMIT (the SDK sends the op after it),
    not when ``send_in_transaction`` returns: on a busy box the producer's event loop can resume
    the caller after the message is already visible (a negative latency).
    ``meter``'s processes' CPU over the open loop goes into the figure, per message.
    """
    topic = env.topic("latency")
    value = payload(size)
    watcher = Watcher(env.bootstrap, topic, env.extra).start()
    decided: dict[str, float] = {}
    total = max(1, int(rate * duration_s))

    def commit(txn: LocalTransaction, _arg: object) -> TxState:
        decided[txn.tx_id] = time.time()
        return TxState.COMMIT

    async def main() -> None:
        async with env.producer(ns, "bench-latency", lambda _t: TxState.COMMIT) as producer:
            loop_start = time.time()
            tasks = []

            for i in range(total):
                delay = loop_start + i / rate - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                message = Message(topic, value, key=str(i % 4096).encode())
                tasks.append(asyncio.create_task(producer.send_in_transaction(message, commit)))
            await asyncio.gather(*tasks)

    ops = Topics(ns).op
    since = op_log_ends(env.bootstrap, ops, PARTITIONS, env.extra)

    def drive() -> dict[str, float]:
        asyncio.run(main())
        return decided

    figure = watched_latency(
        "txbridge commit-to-visible",
        watcher,
        drive,
        meter,
        total=total,
        size=size,
        rate=rate,
        duration_s=duration_s,
    )
    appended = op_append_times(env.bootstrap, ops, PARTITIONS, env.extra, since=since)
    figure.values.update(latency_split(decided, appended, watcher.created, watcher.seen))
    return figure


#: The parts of txbridge's commit-to-visible, in order, as :func:`latency_split` names them.
SPLIT_PARTS = ("decision to op appended", "op to republished", "republished to visible")


def latency_split(
    decided: Mapping[str, float],
    appended: Mapping[str, float],
    created: Mapping[str, float],
    seen: Mapping[str, float],
) -> dict[str, float]:
    """p50 and p99 (ms) of each part of commit-to-visible, by tx id (wall times in s, one host
    clock): the decision -> its op record's LogAppendTime -> the republished record's
    CreateTime (the coordinator's ``produce()``) -> first seen by the read_committed watcher.
    Broker timestamps have millisecond resolution, so a part can come out slightly negative."""
    parts: list[list[float]] = [[], [], []]
    for tx, at in decided.items():
        if tx in appended and tx in created and tx in seen:
            stamps = (at, appended[tx], created[tx], seen[tx])
            for part, (start, end) in zip(parts, itertools.pairwise(stamps), strict=True):
                part.append((end - start) * 1000)
    out: dict[str, float] = {}
    for name, values in zip(SPLIT_PARTS, parts, strict=True):
        if values:
            values.sort()
            out[f"p50 ms, {name}"] = percentile(values, 50)
            out[f"p99 ms, {name}"] = percentile(values, 99)
    return out


def op_log_ends(
    bootstrap: str, topic: str, partitions: int, extra: Mapping[str, Any] | None = None
) -> dict[int, int]:
    """The end offset of each partition of ``topic`` now: where :func:`op_append_times` may start."""
    consumer = kafka.consumer(bootstrap, f"bench-ops-{os.urandom(4).hex()}", extra)
    try:
        return _log_ends(consumer, topic, partitions)
    finally:
        consumer.close()


def _log_ends(consumer: kafka.Consumer, topic: str, partitions: int) -> dict[int, int]:
    return {
        p: consumer.get_watermark_offsets(kafka.partition_at(topic, p), timeout=10)[1]
        for p in range(partitions)
    }


def op_append_times(
    bootstrap: str,
    topic: str,
    partitions: int,
    extra: Mapping[str, Any] | None = None,
    *,
    since: Mapping[int, int] | None = None,
) -> dict[str, float]:
    """tx id -> its first op record's LogAppendTime (s), read from ``since`` (default: the start)
    to the end of ``topic`` (``<ns>_op``, which keeps LogAppendTime)."""
    consumer = kafka.consumer(bootstrap, f"bench-ops-{os.urandom(4).hex()}", extra)
    appended: dict[str, float] = {}
    try:
        start = dict(since or {})
        ends = {p: end for p, end in _log_ends(consumer, topic, partitions).items() if end > start.get(p, 0)}
        consumer.assign([kafka.partition_at(topic, p, start.get(p, kafka.FROM_START)) for p in ends])
        for msg in kafka.read_to_end(consumer, topic, ends, timeout=60, what=f"reading {topic}"):
            stamp = kafka.append_time_ms(msg)
            if stamp is not None:
                for tx_id in op_tx_ids(msg.key(), msg.value()):  # a batch decides several
                    appended.setdefault(tx_id, stamp / 1000)
    finally:
        consumer.close()
    return appended


def watched_latency(
    name: str,
    watcher: Watcher,
    drive: Callable[[], Mapping[str, float]],
    meter: CpuMeter,
    *,
    total: int,
    size: int,
    rate: float,
    duration_s: float,
) -> Figure:
    """An open loop's latency figure: ``drive`` sends ``total`` transactions and returns when each
    was decided, by tx id; ``watcher`` (started, closed here) saw them; ``meter``'s CPU over the
    drive goes into the figure, per message."""
    try:
        meter.start()
        decided = drive()
        cpu = meter.per_message(total)
        watcher.wait(total, timeout=60)
        seen = dict(watcher.seen)
    finally:
        watcher.close()
    figure = latency_figure(
        name, dict(decided), seen, expected=total, size=size, rate=rate, duration_s=duration_s
    )
    figure.values.update(cpu)
    return figure


def backcheck_drain(env: Env, *, size: int, count: int, concurrency: int) -> Figure:
    """``count`` transactions commit locally (barrier row) but answer UNKNOWN: the checks decide.

    All of them are written before a coordinator (default settings) starts on their
    namespace, so the figure is the checks' own rate, not the producer's sending rate.
    """
    ns = env.namespace("checks")
    topic = env.topic("checks")
    barrier = SqliteBarrier(str(env.work / "checks.db"))
    check_times: list[float] = []

    def check(txn: LocalTransaction) -> TxState:
        state = barrier.check(txn)
        check_times.append(time.time())
        return state

    committed: set[str] = set()

    def execute(txn: LocalTransaction, _arg: object) -> TxState:
        with barrier.local_transaction(txn.tx_id):
            pass
        committed.add(txn.tx_id)
        return TxState.UNKNOWN

    value = payload(size)
    watcher = Watcher(env.bootstrap, topic, env.extra).start()
    coordinator = env.coordinator(ns, "checks-coordinator")

    async def main() -> float:
        async with env.producer(ns, "bench-checks", check) as producer:
            msgs = (Message(topic, value, key=str(i).encode(), check_after=0.0) for i in range(count))
            await _send_many(producer, msgs, concurrency, execute, {})
            await asyncio.to_thread(lambda: coordinator.start().wait_ready())
            started = time.time()
            if not await asyncio.to_thread(watcher.wait, len(committed), 300):
                raise BenchError(
                    f"only {len(watcher.seen)} of {len(committed)} locally committed "
                    "transactions became visible"
                )
            return started

    try:
        started = asyncio.run(main())
        last = max(watcher.seen.values())
    finally:
        watcher.close()
        coordinator.stop()
    span = (check_times[-1] - check_times[0]) if len(check_times) > 1 else 0.0
    return Figure(
        "txbridge back-check drain",
        count,
        last - started,
        {
            "checks_per_s": len(check_times) / span if span else 0.0,
            "drain_s": last - started,
            "checks": float(len(check_times)),
        },
        {"count": count, "check_after_s": 0.0, "locally_committed": len(committed), "settings": "defaults"},
    )


async def _leave_unknown(env: Env, ns: str, topic: str, value: bytes, count: int) -> None:
    """``count`` transactions whose local outcome stays UNKNOWN (nothing decides them)."""
    async with env.producer(ns, "bench-memory", lambda _t: TxState.UNKNOWN) as producer:
        msgs = (Message(topic, value, key=str(i).encode()) for i in range(count))
        await _send_many(producer, msgs, 512, _always(TxState.UNKNOWN), {})


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(rf"^txbridge_coordinator_{name}(?:_total)? ([0-9.e+]+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def memory(env: Env, *, size: int, pending: int, cache_bytes: int) -> Figure:
    """Coordinator RSS idle, with ``pending`` open transactions, and with a payload cache at budget."""
    values: dict[str, float] = {}
    for budget in (None, cache_bytes):
        ns = env.namespace(f"mem{len(values)}")
        port = free_port()
        args = ["--check-delay", "3600", "--metrics-port", str(port)]
        if budget is not None:
            args += ["--payload-cache-bytes", str(budget)]
        coordinator = env.coordinator(ns, f"memory-{len(values)}", *args).start()
        try:
            coordinator.wait_ready()
            time.sleep(1.0)
            if budget is None:
                values["rss_idle_mb"] = coordinator.rss_bytes() / 2**20
            topic = env.topic(f"mem{len(values)}")
            asyncio.run(_leave_unknown(env, ns, topic, payload(size), pending))
            deadline = time.monotonic() + 300
            while _metric(port, "pending_transactions") < pending and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(1.0)
            key = "rss_pending_mb" if budget is None else f"rss_pending_cache_{budget // 2**20}mb_mb"
            values[key] = coordinator.rss_bytes() / 2**20
            values["pending" if budget is None else "pending_small_cache"] = _metric(
                port, "pending_transactions"
            )
        finally:
            coordinator.stop()
    return Figure("coordinator memory", pending, 0.0, values, {"size": size, "pending": pending})


def failover(
    env: Env, *, size: int, rate: float = 100.0, after_s: float = 12.0, inside_transaction: bool = False
) -> Figure:
    """Two coordinators; SIGKILL the first under a steady load on every partition.

    Figures: kill -> the first message of the dead one's partitions republished by the survivor
    (the takeover), and the worst commit-to-visible latency, for a read_committed consumer of
    the real topic, of the transactions on the survivor's own partitions committed after the
    kill (what a dead coordinator's open Kafka transaction and the rebalance cost consumers
    of partitions that never moved).

    A kill lands inside one of the first coordinator's Kafka transactions only by chance (a
    few ms of each commit). ``inside_transaction`` makes it the case: right after the kill,
    transactions are opened again under the dead coordinator's partitions' transactional ids,
    holding their offsets and records on the real topic, as a coordinator killed between its
    offsets and its commit leaves them (:func:`_leave_a_transaction_open`).
    """
    ns = env.namespace("failover")
    topic = env.topic("failover")
    first = env.coordinator(ns, "failover-a").start()
    first.wait_ready()
    second = env.coordinator(ns, "failover-b").start()
    try:
        second.wait_ready()
        first.wait_ready(marks=2)  # the rebalance gave `first` its share again
        owned = _last_assignment(first.log_path)
        keys = [str(i).encode() for i in range(200)]
        moved = {k for k in keys if half_partition(k, PARTITIONS) in owned}
        if not moved or len(moved) == len(keys):
            raise BenchError(f"could not tell which partitions the first coordinator owned: {owned}")
        watcher = Watcher(env.bootstrap, topic, env.extra).start()
        left_open: list[Any] = []

        def kill() -> None:
            first.kill()
            if inside_transaction:
                left_open.extend(_leave_a_transaction_open(env, ns, topic, owned, sorted(moved)))

        try:
            committed, killed = _steady_load(
                env, ns, topic, keys, size=size, rate=rate, after_s=after_s, kill=kill
            )
            watcher.wait(len(committed), 60)
        finally:
            watcher.close()
            for producer in left_open:
                producer.flush(0)  # its transaction was aborted by the survivor's claim
    finally:
        first.kill()
        second.stop()
    dead = [
        watcher.seen[tx]
        for tx, (key, at) in committed.items()
        if key in moved and at >= killed and tx in watcher.seen
    ]
    if not dead:
        raise BenchError("the surviving coordinator republished nothing of the dead one's partitions")
    kept = [
        watcher.seen[tx] - at
        for tx, (key, at) in committed.items()
        if key not in moved and at >= killed and tx in watcher.seen
    ]
    values = {
        "seconds_to_first_republish": min(dead) - killed,
        "survivor_partitions_max_visible_s": max(kept, default=0.0),
        "unseen": float(len(committed) - len(watcher.seen)),
        **take_over_split(second.log_path, killed),
    }
    name = "failover inside a transaction" if inside_transaction else "failover"
    # The goal differs on a cluster: the group's session is longer there (coordinator/group/consumer.py).
    params: dict[str, object] = {"rate": rate, "brokers": kafka.broker_count(env.bootstrap, env.extra)}
    return Figure(name, len(committed), values["seconds_to_first_republish"], values, params)


def failovers(env: Env, *, size: int) -> list[Figure]:
    """The ``failover`` step: a kill at a random moment, then one inside a transaction."""
    return [failover(env, size=size), failover(env, size=size, inside_transaction=True)]


def _leave_a_transaction_open(env: Env, ns: str, topic: str, owned: set[int], keys: list[bytes]) -> list[Any]:
    """Open a Kafka transaction under the transactional id the claim records of a just-killed
    coordinator's partitions name (its own) and leave it open: it holds each of those
    partitions' ``<ns>_state`` (a record in each) and one record per key of ``keys`` on the
    real ``topic``. Until the next owner fences that id, read_committed readers of those
    partitions see nothing past it. Returns the producers (keep them: a transaction stays open
    only while nothing aborts it)."""
    topics = Topics(ns)
    owners = changelog.read_owners(env.bootstrap, topics.state, sorted(owned), env.extra)
    held: dict[str, list[int]] = {}
    for number in sorted(owned):
        claims = changelog.claimants(owners.get(number, []))
        name = claims[-1] if claims else partition_transactional_id(ns, number)
        held.setdefault(name, []).append(number)
    producers: list[Any] = []
    for index, (transactional_id, numbers) in enumerate(sorted(held.items())):
        producer = kafka.producer(env.bootstrap, env.extra, transactional_id=transactional_id)
        producers.append(producer)
        producer.init_transactions(30)
        producer.begin_transaction()
        if index == 0:
            for key in keys:
                producer.produce(topic, key=key, value=b"left open by the killed coordinator")
        for number in numbers:
            producer.produce(topics.state, key=b"left-open", value=None, partition=number)
        producer.flush(30)
    return producers


def restart(env: Env, *, size: int, rate: float = 100.0, after_s: float = 8.0) -> Figure:
    """One coordinator SIGKILLed and started again at once with the same instance id (a process
    supervisor's restart): kill -> the first message republished after it."""
    ns = env.namespace("restart")
    topic = env.topic("restart")
    coordinator = env.coordinator(ns, "restart-a").start()
    try:
        coordinator.wait_ready()
        watcher = Watcher(env.bootstrap, topic, env.extra).start()
        try:

            def kill_and_restart() -> None:
                coordinator.kill()
                coordinator.start()

            committed, killed = _steady_load(
                env,
                ns,
                topic,
                [str(i).encode() for i in range(200)],
                size=size,
                rate=rate,
                after_s=after_s,
                kill=kill_and_restart,
            )
            watcher.wait(len(committed), 60)
        finally:
            watcher.close()
    finally:
        coordinator.stop()
    after = [watcher.seen[tx] for tx, (_key, at) in committed.items() if at >= killed and tx in watcher.seen]
    if not after:
        raise BenchError("the restarted coordinator republished nothing")
    values = {
        "seconds_to_first_republish": min(after) - killed,
        "unseen": float(len(committed) - len(watcher.seen)),
        **restart_timeline(coordinator.current_log(), killed),
    }
    return Figure("restart", len(committed), values["seconds_to_first_republish"], values, {"rate": rate})


#: What the restarted coordinator logs on its way back, in order (coordinator/service.py,
#: coordinator/commit/ownership.py, coordinator/group/rebalance.py), by the figure it gives.
_RESTART_MARKS = {
    "restart_first_log_s": "",  # Python's start, the imports, the cluster's size asked
    "restart_claimed_s": "commits under the transactional id",
    "restart_fenced_s": "fenced the earlier owners",
    "restart_assigned_s": "assigned partitions",  # after the restore
}
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def restart_timeline(log: str, killed: float) -> dict[str, float]:
    """Seconds from the kill to each of the restarted coordinator's steps back (its log's
    ``asctime``, local time, to the millisecond); a step it did not log is left out."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        match = _LOG_TIME.match(line)
        if match is None:
            continue
        at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000
        for name, mark in _RESTART_MARKS.items():
            if name not in out and mark in line:
                out[name] = round(at - killed, 3)
    return out


def coordinator_transaction_timeout_s() -> float:
    """The ``transaction_timeout_ms`` a coordinator with default settings runs under, in s."""
    from dataclasses import fields

    from coordinator.config import CoordinatorConfig

    default = next(f.default for f in fields(CoordinatorConfig) if f.name == "transaction_timeout_ms")
    return float(default) / 1000  # type: ignore[arg-type]


def renamed(env: Env, *, size: int, rate: float = 100.0, after_s: float | None = None) -> Figure:
    """One coordinator SIGKILLed and replaced at once by one under a new instance id (a
    deployment that names instances afresh: a new pod, a new host): kill -> every half
    partition's first message visible again, set against the transaction timeout the
    coordinators ran under (a dead owner's open transaction may hold a partition that long).

    The load goes on for the transaction timeout plus 15 s after the kill (``after_s``), so a
    partition that comes back within the bound is seen.
    """
    timeout_s = coordinator_transaction_timeout_s()
    ns = env.namespace("renamed")
    topic = env.topic("renamed")
    first = env.coordinator(ns, "renamed-a").start()
    replacement = env.coordinator(ns, "renamed-b")  # an instance id of its own
    keys = [str(i).encode() for i in range(200)]
    try:
        first.wait_ready()
        watcher = Watcher(env.bootstrap, topic, env.extra).start()
        try:

            def kill_and_replace() -> None:
                first.kill()
                replacement.start()

            committed, killed = _steady_load(
                env,
                ns,
                topic,
                keys,
                size=size,
                rate=rate,
                after_s=timeout_s + 15.0 if after_s is None else after_s,
                kill=kill_and_replace,
            )
            watcher.wait(len(committed), 60)
        finally:
            watcher.close()
    finally:
        first.kill()
        replacement.stop()
    back = visible_again(committed, watcher.seen, killed, lambda key: half_partition(key, PARTITIONS))
    if not back:
        raise BenchError("the renamed coordinator republished nothing")
    values = {
        "seconds_to_first_republish": min(back.values()),
        "seconds_to_every_partition": max(back.values()),
        "partitions_back": float(len(back)),
        "unseen": float(len(committed) - len(watcher.seen)),
    }
    params: dict[str, object] = {"rate": rate, "transaction_timeout_s": timeout_s, "partitions": PARTITIONS}
    return Figure("renamed restart", len(committed), values["seconds_to_every_partition"], values, params)


def visible_again(
    committed: Mapping[str, tuple[bytes, float]],
    seen: Mapping[str, float],
    killed: float,
    partition_of: Callable[[bytes], int],
) -> dict[int, float]:
    """Per partition, s from ``killed`` until the first message committed since then was seen.

    Args:
        committed: tx id -> (key, wall time its transaction committed).
        seen: tx id -> wall time a read_committed consumer first received it.
        killed: the kill's wall time.
        partition_of: a key's half partition.

    A partition none of whose messages since the kill was seen is absent.
    """
    back: dict[int, float] = {}
    for tx, (key, at) in committed.items():
        if at < killed or tx not in seen:
            continue
        number = partition_of(key)
        delay = seen[tx] - killed
        if number not in back or delay < back[number]:
            back[number] = delay
    return back


def _steady_load(
    env: Env,
    ns: str,
    topic: str,
    keys: list[bytes],
    *,
    size: int,
    rate: float,
    after_s: float,
    kill: Callable[[], None],
) -> tuple[dict[str, tuple[bytes, float]], float]:
    """Commit transactions round-robin over ``keys`` at ``rate`` for 2-4 s, ``kill()``, go on
    for ``after_s``. Returns {tx id: (key, wall time it committed)} and the kill's wall time.

    The kill's moment is drawn at random: a fixed one would always fall at the same point of
    the coordinators' heartbeat cycle (they join together), and the takeover depends on it.
    """
    value = payload(size)
    kill_at = 2 + random.uniform(0, KILL_SPREAD_S)  # noqa: S311 - a moment, not a secret
    committed: dict[str, tuple[bytes, float]] = {}
    killed = [0.0]

    async def main() -> None:
        async with env.producer(ns, "bench-failover", lambda _t: TxState.COMMIT) as producer:
            started = time.monotonic()
            for i in range(int(rate * (kill_at + after_s))):
                if not killed[0] and time.monotonic() - started >= kill_at:
                    killed[0] = time.time()  # kill() may go on after the kill (a restart, a transaction)
                    await asyncio.to_thread(kill)
                key = keys[i % len(keys)]
                message = Message(topic, value, key=key)
                result = await producer.send_in_transaction(message, _always(TxState.COMMIT))
                if result.state is TxState.COMMIT:
                    committed[result.tx_id] = (key, time.time())
                await asyncio.sleep(1 / rate)

    asyncio.run(main())
    return committed, killed[0]


#: A coordinator log line's time and the take-over's duration, from the line that ends a take-over.
_RESTORED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*restored \d+ pending transactions in ([\d.]+)s$"
)


def take_over_split(log: Path, killed: float) -> dict[str, float]:
    """Where a takeover's time went, from the survivor's log (same host, same clock): the kill
    to the start of its take-over (the group session running out, the rebalance), and the
    take-over itself (the owners read and fenced, the claim, ``<ns>_state`` restored). Empty
    when the log has no take-over after the kill."""
    for line in log.read_text(errors="replace").splitlines():
        found = _RESTORED.match(line)
        if found is None:
            continue
        ended = time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S")) + int(found[2]) / 1000
        took = float(found[3])
        if ended >= killed:
            return {"seconds_to_take_over_start": ended - took - killed, "take_over_s": took}
    return {}


def _last_assignment(log: Path) -> set[int]:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "assigned partitions" in ln]
    if not lines:
        return set()
    return {int(n) for n in re.findall(r"\d+", lines[-1].split("assigned partitions", 1)[1])}
