"""The Kafka-only baselines (raw produce, native Kafka transactions) and what every step shares.

Shared: :class:`Figure`, :class:`BenchError`, :func:`percentile` and :func:`latency_figure`.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from txbridge import kafka
from txbridge.errors import KafkaOperationError, TxBridgeError


class BenchError(TxBridgeError):
    """A benchmark could not complete (what was missing is in the message)."""


@dataclass
class Figure:
    """One benchmark's measured figures (names -> numbers) and how it was run."""

    name: str
    messages: int = 0
    seconds: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    params: dict[str, object] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


class CpuMeter:
    """CPU time of named processes over a measured window, as µs per message (psutil).

    A process that cannot be read (gone, or never found) is left out, never guessed.
    """

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self._procs: dict[str, psutil.Process] = {}
        for name, pid in pids.items():
            if pid is None:
                continue
            try:
                self._procs[name] = psutil.Process(pid)
            except psutil.Error:
                continue
        self._start: dict[str, float] = {}

    @staticmethod
    def _cpu_s(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return float(times.user + times.system)

    def start(self) -> None:
        self._start = {}
        for name, proc in self._procs.items():
            try:
                self._start[name] = self._cpu_s(proc)
            except psutil.Error:
                continue

    def per_message(self, messages: int) -> dict[str, float]:
        """``{"<name>_cpu_us_per_msg": µs}`` since :meth:`start`, for each process still readable."""
        out: dict[str, float] = {}
        for name, began in self._start.items():
            try:
                used = self._cpu_s(self._procs[name]) - began
            except psutil.Error:
                continue
            out[f"{name}_cpu_us_per_msg"] = used / messages * 1e6 if messages else 0.0
        return out


NO_METER = CpuMeter({})

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def broker_pid(bootstrap: str) -> int | None:
    """The pid of the broker at ``bootstrap`` when it runs on this machine (its CPU is then
    measured), else None.

    The checkout's own local broker first; then any process listening on the bootstrap's port
    when its host is this machine, so a broker another checkout (or anything else) started is
    measured too instead of silently not at all.
    """
    from servers.broker import LocalKafka

    status = LocalKafka.from_home().status()
    if status.running and status.bootstrap == bootstrap and status.pid and psutil.pid_exists(status.pid):
        return int(status.pid)
    host, _, port = bootstrap.rpartition(":")
    host = host.strip("[]")
    if "," in bootstrap or not port.isdigit() or host not in _LOCAL_HOSTS:
        return None
    try:
        listeners = psutil.net_connections(kind="tcp")
    except psutil.Error:  # not allowed to list other users' sockets
        return None
    for conn in listeners:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == int(port) and conn.pid:
            return int(conn.pid)
    return None


def payload(size: int) -> bytes:
    return os.urandom(size)


def raw_produce(
    bootstrap: str,
    topic: str,
    *,
    size: int,
    count: int,
    meter: CpuMeter = NO_METER,
    extra: Mapping[str, Any] | None = None,
) -> Figure:
    """Idempotent, acks=all producer at full speed: the ceiling of this broker and machine.

    ``extra``: the cluster's client settings (librdkafka names), as every bench client takes them.
    """
    producer = kafka.producer(bootstrap, extra, linger_ms=5, batch_num_messages=10000)
    value = payload(size)
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    meter.start()
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i % 1024).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise KafkaOperationError(
            f"raw produce: {remaining} undelivered, {len(failures)} failed: {failures[:3]}"
        )
    return Figure(
        "raw produce",
        count,
        elapsed,
        {"msgs_per_s": count / elapsed, "mb_per_s": count * size / elapsed / 1e6, **meter.per_message(count)},
        {"size": size, "count": count},
    )


def started_at(
    ready: threading.Barrier,
    errors: list[BaseException],
    bootstrap: str,
    extra: Mapping[str, Any] | None,
    transactional_id: str,
) -> Any:
    """A transactional producer (no linger), initialised, released once every thread at ``ready``
    is; None when it or another could not start (its error goes on ``errors``, ``ready`` breaks)."""
    try:
        producer = kafka.producer(bootstrap, extra, transactional_id=transactional_id, linger_ms=0)
        producer.init_transactions(30)
    except BaseException as exc:
        errors.append(exc)
        ready.abort()
        return None
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        return None
    return producer


class _NativeLoops:
    """``concurrency`` threads, each a transactional producer looping begin / produce / commit.

    Released together by one barrier, whose action starts the clock and the CPU meter.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        value: bytes,
        per_txn: int,
        duration_s: float,
        concurrency: int,
        meter: CpuMeter,
        extra: Mapping[str, Any] | None,
    ) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._value = value
        self._per_txn = per_txn
        self._duration_s = duration_s
        self._meter = meter
        self._extra = extra
        self.committed = [0] * concurrency
        self.commit_ms: list[list[float]] = [[] for _ in range(concurrency)]
        self.errors: list[BaseException] = []
        self.started = 0.0
        self._stop_at = 0.0
        self._ready = threading.Barrier(concurrency + 1, action=self._start_clock)
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(concurrency)
        ]

    def _start_clock(self) -> None:  # the barrier's action: runs once, before any thread is released
        self._meter.start()
        self.started = time.perf_counter()
        self._stop_at = self.started + self._duration_s

    def _worker(self, index: int) -> None:
        producer = started_at(
            self._ready, self.errors, self._bootstrap, self._extra, f"bench-{uuid.uuid4().hex[:8]}-{index}"
        )
        if producer is None:
            return
        try:
            while time.perf_counter() < self._stop_at:
                began = time.perf_counter()
                producer.begin_transaction()
                for i in range(self._per_txn):
                    producer.produce(self._topic, value=self._value, key=str(i % 64).encode())
                producer.commit_transaction(30)
                self.commit_ms[index].append((time.perf_counter() - began) * 1000)
                self.committed[index] += self._per_txn
        except BaseException as exc:  # reported by the caller: a silent thread would leave a figure of 0
            self.errors.append(exc)

    def run(self) -> float:
        """Start every loop, wait for them all to end; the seconds they ran.

        Raises:
            KafkaOperationError: a producer could not start.
        """
        for thread in self._threads:
            thread.start()
        try:
            self._ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            raise KafkaOperationError(f"native transactions could not start: {self.errors[:1]}") from None
        for thread in self._threads:
            thread.join()
        return time.perf_counter() - self.started


def native_transactions(
    bootstrap: str,
    topic: str,
    *,
    size: int,
    per_txn: int,
    duration_s: float,
    concurrency: int,
    meter: CpuMeter = NO_METER,
    extra: Mapping[str, Any] | None = None,
) -> Figure:
    """``concurrency`` transactional producers, each looping begin / produce ``per_txn`` / commit."""
    loops = _NativeLoops(
        bootstrap,
        topic,
        value=payload(size),
        per_txn=per_txn,
        duration_s=duration_s,
        concurrency=concurrency,
        meter=meter,
        extra=extra,
    )
    elapsed = loops.run()
    total = sum(loops.committed)
    cpu = meter.per_message(total)
    if loops.errors:
        raise BenchError(f"a native transactional producer failed: {loops.errors[0]!r}")
    latencies = sorted(x for per in loops.commit_ms for x in per)
    name = "native txn per message" if per_txn == 1 else f"native txn, {per_txn} per txn"
    if not total:
        raise BenchError(f"{name}: no transaction committed in {elapsed:.1f} s")
    return Figure(
        name,
        total,
        elapsed,
        {
            "msgs_per_s": total / elapsed,
            "txn_per_s": len(latencies) / elapsed,
            "txn_p50_ms": percentile(latencies, 50),
            "txn_p99_ms": percentile(latencies, 99),
            **cpu,
        },
        {"size": size, "per_txn": per_txn, "concurrency": concurrency, "duration_s": duration_s},
    )


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    # The smallest value with at least pct% of the values at or below it (ceil, not round half even).
    rank = max(0, min(len(sorted_values) - 1, math.ceil(pct * len(sorted_values) / 100) - 1))
    return sorted_values[rank]


def latency_figure(
    name: str,
    committed: Mapping[str, float],
    seen: Mapping[str, float],
    *,
    expected: int,
    size: int,
    rate: float,
    duration_s: float,
) -> Figure:
    """The commit-to-visible figure of an open-loop run at ``rate`` msgs/s.

    ``committed`` and ``seen`` are wall times (s) by tx id: when each transaction
    committed, and when a read_committed consumer first saw its message.

    Raises:
        BenchError: fewer than ``expected`` committed messages became visible.
    """
    lat = sorted((seen[tx] - t) * 1000 for tx, t in committed.items() if tx in seen)
    if len(lat) < expected:
        missing = expected - len(lat)
        raise BenchError(f"{missing} of {expected} committed messages never became visible ({name})")
    return Figure(
        name,
        len(lat),
        duration_s,
        {
            "rate_msgs_per_s": rate,
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "max_ms": lat[-1],
        },
        {"size": size, "rate": rate, "duration_s": duration_s, "open_loop": True},
    )
