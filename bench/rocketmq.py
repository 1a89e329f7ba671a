"""The real Apache RocketMQ 5 beside txbridge, in the same bench run on the same machine.

What the step measures, each side configured alike (``docs/bench.md``, "Beside the real RocketMQ"):

- **transactional sends end to end** (``rocketmq txn end to end``): ``in_flight`` threads of one
  producer process (the bench's own) loop begin / send the half message / commit, with no local
  work (txbridge's end-to-end step commits with no local work either); the clock stops when a
  consumer has received the last committed message, as txbridge's end-to-end figure is counted
  on the real topic. A warm-up of the freshly started JVMs comes first and is not counted.
- **plain sends** (``rocketmq plain send``): the same threads and message size, ``send`` with no
  transaction: what the Python client and the broker cost without a transaction, so the reader
  can tell the client's cost from the transaction's.
- **commit-to-visible** (``rocketmq commit-to-visible``): open loop, a transaction starts every
  ``1/rate`` s, from ``commit()`` returning to a consumer receiving the message. The rate is
  txbridge's latency rate, capped at half of RocketMQ's measured transactional rate (past its
  saturation the figure would measure a queue); txbridge is then timed again at exactly that
  rate (``txbridge commit-to-visible (RocketMQ's rate)``), so the latency ratio compares equals.

The consumer is a ``SimpleConsumer`` (long-polling ``receive`` of up to 32 messages, acked
asynchronously) in a process of its own, stamping the wall time at which each message id
arrives. A SimpleConsumer rather than a PushConsumer: its receive loop is ours, so the stamp is
taken when the broker's answer arrives, not after a hop through the push consumer's listener
pool, and there is no assignment scan (every 5 s) to wait for at the start. It is what
txbridge's watcher is on Kafka: a bare consumer loop in its own process, away from the
producer's GIL.

The broker: RocketMQ's default ``flushDiskType=ASYNC_FLUSH`` (the page cache, no fsync per
message), as Kafka by default does not fsync per message either; one broker embedded in the
proxy (``servers.rocketmq``); topics with 6 queues (txbridge's bench topics have 6
partitions); messages without keys (a RocketMQ key is an index entry, not a partitioning key;
ordering keys, ``message_group``, are not allowed on transactional messages).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kafka_native import (
    BenchError,
    CpuMeter,
    Figure,
    latency_figure,
    payload,
    percentile,
)
from servers import jars
from servers.broker import port_in_use
from txbridge.errors import TxBridgeError

logger = logging.getLogger(__name__)

#: Queues of the bench's RocketMQ topics: txbridge's bench topics have 6 partitions.
QUEUES = 6
#: A received message stays invisible to the group this long unless acked (every one is acked).
INVISIBLE_S = 60
#: The consumer's long-poll: a receive returns at once when messages arrive, else after this.
AWAIT_S = 2
RECEIVE_BATCH = 32
RECEIVE_THREADS = 2
ACK_THREADS = 4
#: The broker's start-up, when the bench starts it: busy cores make it several times slower.
START_TIMEOUT_S = 180.0
#: Client request timeout (s): a send, commit or receive that takes longer fails the step.
REQUEST_TIMEOUT_S = 10
#: mqadmin commands that time out are run again, up to this many times in all.
ADMIN_ATTEMPTS = 3

Progress = Callable[[str], None]


class StepSkipped(BenchError):
    """A step cannot run on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class RocketMQOptions:
    """Where the RocketMQ step finds its RocketMQ (``txbridge bench --rocketmq-*``).

    With no ``endpoint`` the step starts a local RocketMQ on free ports in its work folder and
    stops it afterwards.
    """

    #: the gRPC proxy of an existing RocketMQ 5 (``host:port``).
    endpoint: str | None = None
    #: its name server, for creating the bench's topics (``mqadmin updateTopic``).
    namesrv: str | None = None
    cluster: str = "DefaultCluster"
    start_timeout_s: float = START_TIMEOUT_S
    keep_topics: bool = False


@dataclass
class _Target:
    endpoint: str
    namesrv: str
    cluster: str
    admin: Any  # servers.rocketmq.LocalRocketMQ: runs mqadmin
    #: the proxy (broker embedded) when the bench started it: its CPU is the broker's.
    broker_pid: int | None = None
    topics: list[str] = field(default_factory=list)


def skip_reason(options: RocketMQOptions) -> str | None:
    """Why the RocketMQ step cannot run here, or None when it can."""
    try:
        import rocketmq  # noqa: F401
    except ImportError:
        return "the RocketMQ Python client is not installed (pip install -e '.[rocketmq]')"
    if options.endpoint is None:
        folder = jars.cache_root() / "jars" / jars.ROCKETMQ.name
        if not (folder / ".complete").is_file():
            return (
                f"the RocketMQ {jars.ROCKETMQ_VERSION} jars are not in {folder} (fetch them: txbridge setup)"
            )
    return None


@contextmanager
def _rocketmq(options: RocketMQOptions, work: Path, progress: Progress) -> Iterator[_Target]:
    """The RocketMQ to measure: the given one, or a local one started (and stopped) here."""
    from servers.rocketmq import LocalRocketMQ

    if options.endpoint is not None:
        if not options.namesrv:
            raise BenchError("--rocketmq-endpoint needs --rocketmq-namesrv (to create the bench's topics)")
        for address, what in (
            (options.endpoint, "proxy (--rocketmq-endpoint)"),
            (options.namesrv, "name server (--rocketmq-namesrv)"),
        ):
            host, _, port = address.rpartition(":")
            if not port.isdigit() or not port_in_use(host or "127.0.0.1", int(port)):
                raise BenchError(f"nothing listens at the RocketMQ {what} {address}")
        target = _Target(options.endpoint, options.namesrv, options.cluster, LocalRocketMQ(work / "rocketmq"))
        try:
            yield target
        finally:
            if not options.keep_topics:
                _delete_topics(target)
        return
    local = LocalRocketMQ.on_free_ports(work / "rocketmq")
    # RocketMQ's own transaction settings, as a user's broker has them (op records batched every
    # 3 s, a first check after 6 s), not the local default's quicker checks (no check happens here).
    local.transaction_settings = {}
    progress(
        f"starting RocketMQ {jars.ROCKETMQ_VERSION} (name server, proxy with embedded broker) "
        f"in {local.home} ..."
    )
    started = time.monotonic()
    status = local.start(timeout=options.start_timeout_s)
    progress(f"RocketMQ up at {status.endpoint} in {time.monotonic() - started:.0f}s")
    try:
        yield _Target(status.endpoint, status.namesrv_addr, options.cluster, local, status.proxy_pid)
    finally:
        local.stop(timeout=15)
        # The store (commit log, consume queues) goes; the logs stay with the run's other logs.
        shutil.rmtree(local.home / "store", ignore_errors=True)


def _create_topics(target: _Target, specs: list[tuple[str, bool]]) -> None:
    """Create the topics, one mqadmin JVM each, one after the other."""
    for topic, transactional in specs:
        kind = "TRANSACTION" if transactional else "NORMAL"
        _admin(
            target,
            "updateTopic",
            *("-n", target.namesrv, "-c", target.cluster, "-t", topic),
            *("-r", str(QUEUES), "-w", str(QUEUES), "-a", f"+message.type={kind}"),
        )
        target.topics.append(topic)


def _admin(target: _Target, *args: str, attempts: int = ADMIN_ATTEMPTS) -> str:
    """One mqadmin command, again when it timed out: its requests wait 3 s, and on busy cores
    a cold admin JVM's first request can take longer (the command is idempotent)."""
    for attempt in range(1, attempts + 1):
        try:
            return str(target.admin.admin(*args))
        except TxBridgeError as error:
            if "timeout" not in str(error).lower() or attempt == attempts:
                raise
            logger.info("mqadmin %s timed out (attempt %d of %d); again", args[0], attempt, attempts)
    raise AssertionError("unreachable")


def _delete_topics(target: _Target) -> None:
    for topic in target.topics:
        try:
            _admin(target, "deleteTopic", "-n", target.namesrv, "-c", target.cluster, "-t", topic)
        except TxBridgeError as error:  # best effort, on someone else's cluster
            logger.warning("could not delete the RocketMQ topic %s: %s", topic, error)


class _Watcher:
    """A SimpleConsumer in a process of its own: the wall time each message id first arrives."""

    def __init__(self, endpoint: str, topic: str, group: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.seen: dict[str, float] = {}
        self._queue: Any = ctx.Queue()
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_watch,
            args=(endpoint, topic, group),
            kwargs={"out": self._queue, "stop": self._stop, "ready": self._ready},
        )
        self._drain = threading.Thread(target=self._collect, daemon=True)
        self.error: str | None = None

    def start(self, timeout: float = 90.0) -> _Watcher:
        self._proc.start()
        self._drain.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self.error or not self._proc.is_alive() or time.monotonic() > deadline:
                self.close()
                cause = self.error or (
                    f"exit code {self._proc.exitcode}" if self._proc.exitcode is not None else "no answer"
                )
                raise BenchError(f"the RocketMQ consumer did not start within {timeout:.0f}s: {cause}")
        return self

    def _collect(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if isinstance(batch, str):
                self.error = batch
                continue
            for message_id, seen in batch:
                self.seen.setdefault(message_id, seen)

    def wait(self, wanted: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(i in self.seen for i in wanted):
                return True
            time.sleep(0.05)
        return all(i in self.seen for i in wanted)

    def close(self) -> None:
        self._stop.set()
        self._proc.join(20)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
            self._queue.put(None)
        self._drain.join(5)


def _watch(endpoint: str, topic: str, group: str, *, out: Any, stop: Any, ready: Any) -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=REQUEST_TIMEOUT_S)
    try:
        consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=AWAIT_S)
        consumer.startup()
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        out.put(None)
        return
    # Acks are synchronous calls on a pool of their own: the client's ack_async (5.1.2) makes an
    # asyncio Future and fails in any thread without an event loop.
    acker = ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="rocketmq-ack")
    try:

        def receive() -> bool:
            try:
                messages = consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            except Exception:  # a fresh consumer's first receive may fail; the loop retries
                logger.debug("receive failed", exc_info=True)
                time.sleep(0.2)
                return False
            now = time.time()
            if messages:
                out.put([(m.message_id, now) for m in messages])
                for message in messages:
                    acker.submit(consumer.ack, message)
            return True

        deadline = time.monotonic() + 60
        while not receive():  # one answer from the broker before the producers start
            if time.monotonic() > deadline:
                out.put("no receive succeeded within 60s")
                return
        ready.set()

        def loop() -> None:
            while not stop.is_set():
                receive()

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(RECEIVE_THREADS)]
        for thread in threads:
            thread.start()
        stop.wait()
        for thread in threads:
            thread.join(AWAIT_S + REQUEST_TIMEOUT_S)
    finally:
        acker.shutdown(wait=True, cancel_futures=True)
        with suppress(Exception):
            consumer.shutdown()
        out.put(None)


def _producer(endpoint: str, topics: tuple[str, ...]) -> Any:
    from rocketmq import ClientConfiguration, Credentials, Producer, TransactionChecker, TransactionResolution

    class CommitChecker(TransactionChecker):
        """Answers COMMIT; no check is expected, every transaction is decided at once."""

        def check(self, _message: Any) -> Any:
            return TransactionResolution.COMMIT

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=REQUEST_TIMEOUT_S)
    producer = Producer(config, topics, CommitChecker())
    producer.startup()
    return producer


def _message(topic: str, body: bytes) -> Any:
    from rocketmq import Message

    message = Message()
    message.topic = topic
    message.body = body
    return message


def _transaction(producer: Any, topic: str, body: bytes) -> str:
    """Begin, send the half message, commit: one RocketMQ transaction with no local work."""
    return _decided_transaction(producer, topic, body)[0]


def _decided_transaction(producer: Any, topic: str, body: bytes) -> tuple[str, float]:
    """:func:`_transaction`, and the wall time of its decision (before ``commit()`` is called)."""
    transaction = producer.begin_transaction()
    receipt = producer.send(_message(topic, body), transaction)
    decided = time.time()
    transaction.commit()
    return str(receipt.message_id), decided


def _plain_send(producer: Any, topic: str, body: bytes) -> str:
    return str(producer.send(_message(topic, body)).message_id)


@dataclass
class _Loop:
    """What a closed loop of ``threads`` threads did: (message id, wall time done, ms) per call."""

    done: list[tuple[str, float, float]]
    started: float  # wall time
    elapsed: float
    cpu: dict[str, float]


def _closed_loop(
    threads: int, duration_s: float, call: Callable[[], str], meter: CpuMeter | None = None
) -> _Loop:
    """``threads`` threads call ``call`` back to back for ``duration_s``; all start together."""
    done: list[list[tuple[str, float, float]]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    clock = {"started": 0.0, "stop_at": 0.0, "wall": 0.0}

    def start_clock() -> None:
        if meter is not None:
            meter.start()
        clock["wall"] = time.time()
        clock["started"] = time.perf_counter()
        clock["stop_at"] = clock["started"] + duration_s

    ready = threading.Barrier(threads, action=start_clock)

    def worker(index: int) -> None:
        try:
            ready.wait(30)
        except threading.BrokenBarrierError:
            return
        mine = done[index]
        try:
            while time.perf_counter() < clock["stop_at"]:
                began = time.perf_counter()
                message_id = call()
                mine.append((message_id, time.time(), (time.perf_counter() - began) * 1000))
        except BaseException as exc:  # reported below: a silent thread would bias the figure
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(duration_s + 4 * REQUEST_TIMEOUT_S + 30)
    elapsed = time.perf_counter() - clock["started"]
    total = sum(len(d) for d in done)
    if errors:
        raise BenchError(f"a RocketMQ producer thread failed after {total} calls: {errors[0]!r}")
    if any(thread.is_alive() for thread in pool):
        raise BenchError("a RocketMQ producer thread did not finish (a request hung past its timeout)")
    cpu = meter.per_message(total) if meter is not None else {}
    return _Loop([x for d in done for x in d], clock["wall"], elapsed, cpu)


@dataclass(frozen=True)
class Comparison:
    """How the RocketMQ step is run: the txbridge settings it mirrors."""

    size: int
    #: transactions (threads) in flight: txbridge's ``--in-flight``.
    in_flight: int
    duration_s: float
    latency_s: float
    #: txbridge's commit-to-visible rate (half its saturated rate), msgs/s.
    txbridge_rate: float


def run(
    options: RocketMQOptions,
    comparison: Comparison,
    work: Path,
    *,
    txbridge_latency: Callable[[float], Figure] | None = None,
    progress: Progress = logger.info,
) -> list[Figure]:
    """Start (or reach) RocketMQ and measure it; then txbridge's latency at RocketMQ's rate.

    Returns:
        ``rocketmq txn end to end``, ``rocketmq plain send``, ``rocketmq commit-to-visible`` and,
        when ``txbridge_latency`` is given, its figure at the rate RocketMQ was timed at.

    Raises:
        StepSkipped: the Python client or (for a local RocketMQ) the jars are missing.
        BrokerError: the local RocketMQ did not start (the cause is in the first line).
        BenchError: a send failed, or committed messages never arrived.
    """
    reason = skip_reason(options)
    if reason:
        raise StepSkipped(reason)
    c = comparison
    run_id = uuid.uuid4().hex[:8]
    tx_topic, plain_topic = f"txb-bench-{run_id}-tx", f"txb-bench-{run_id}-plain"
    body = payload(c.size)
    with _rocketmq(options, work, progress) as target:
        progress(f"creating topics {tx_topic} (transactional) and {plain_topic}, {QUEUES} queues each ...")
        _create_topics(target, [(tx_topic, True), (plain_topic, False)])
        watcher = _Watcher(target.endpoint, tx_topic, f"txb-bench-{run_id}").start()
        producer = None
        try:
            producer = _producer(target.endpoint, (tx_topic, plain_topic))
            pids = {"broker": target.broker_pid, "client": os.getpid()}
            warm_s = max(3.0, c.duration_s)
            progress(
                f"warming up the JVMs: {c.in_flight} threads of transactional sends for {warm_s:.0f}s ..."
            )
            _closed_loop(c.in_flight, warm_s, lambda: _transaction(producer, tx_topic, body))
            progress(f"transactional sends: {c.in_flight} threads for {c.duration_s:.0f}s ...")
            tx = _closed_loop(
                c.in_flight, c.duration_s, lambda: _transaction(producer, tx_topic, body), CpuMeter(pids)
            )
            if not watcher.wait([d[0] for d in tx.done], 60):
                missing = sum(1 for d in tx.done if d[0] not in watcher.seen)
                raise BenchError(f"{missing} of {len(tx.done)} committed RocketMQ messages never arrived")
            tx_figure = _throughput_figure(
                "rocketmq txn end to end", tx, watcher.seen, c, "begin+send+commit"
            )
            progress(f"transactional: {tx_figure.msgs_per_s:,.0f} msgs/s end to end")
            progress(f"plain sends: {c.in_flight} threads for {c.duration_s:.0f}s ...")
            plain = _closed_loop(
                c.in_flight, c.duration_s, lambda: _plain_send(producer, plain_topic, body), CpuMeter(pids)
            )
            plain_figure = _throughput_figure("rocketmq plain send", plain, None, c, "send")
            progress(f"plain: {plain_figure.msgs_per_s:,.0f} msgs/s")
            rate = min(c.txbridge_rate, tx_figure.msgs_per_s / 2)
            progress(f"commit-to-visible: open loop at {rate:,.0f} msgs/s for {c.latency_s:.0f}s ...")
            latency = _latency(producer, watcher, tx_topic, body=body, rate=rate, c=c)
        finally:
            if producer is not None:
                with suppress(Exception):
                    producer.shutdown()
            watcher.close()
        progress("stopping RocketMQ" if options.endpoint is None else "deleting the bench's topics")
    latency.params["capped_at_half_rocketmq_rate"] = rate < c.txbridge_rate
    figures = [tx_figure, plain_figure, latency]
    if txbridge_latency is not None:
        progress(f"txbridge commit-to-visible at the same {rate:,.0f} msgs/s ...")
        same = txbridge_latency(rate)
        same.name = "txbridge commit-to-visible (RocketMQ's rate)"
        figures.append(same)
    return figures


def _throughput_figure(
    name: str, loop: _Loop, seen: dict[str, float] | None, c: Comparison, timed: str
) -> Figure:
    count = len(loop.done)
    if not count:
        raise BenchError(f"{name}: nothing was sent in {loop.elapsed:.1f}s")
    # End to end (like txbridge's): until the consumer received the last one; else until the last ack.
    seconds = (max(seen[d[0]] for d in loop.done) - loop.started) if seen is not None else loop.elapsed
    call_ms = sorted(d[2] for d in loop.done)
    return Figure(
        name,
        count,
        seconds,
        {
            "msgs_per_s": count / seconds,
            "mb_per_s": count * c.size / seconds / 1e6,
            "call_p50_ms": percentile(call_ms, 50),
            "call_p99_ms": percentile(call_ms, 99),
            **loop.cpu,
        },
        {
            "size": c.size,
            "threads": c.in_flight,
            "duration_s": c.duration_s,
            "timed_call": timed,
            "counted": "received by a SimpleConsumer" if seen is not None else "acknowledged sends",
            "queues": QUEUES,
            "flush": "ASYNC_FLUSH",
            "rocketmq": jars.ROCKETMQ_VERSION,
        },
    )


def _latency(
    producer: Any, watcher: _Watcher, topic: str, *, body: bytes, rate: float, c: Comparison
) -> Figure:
    """Open loop at ``rate``: the decision (before commit() is called, as txbridge's clock starts
    when its local transaction returns COMMIT) -> the SimpleConsumer received the message."""
    total = max(1, int(rate * c.latency_s))
    committed: dict[str, float] = {}

    def one() -> None:
        message_id, decided = _decided_transaction(producer, topic, body)
        committed[message_id] = decided

    with ThreadPoolExecutor(c.in_flight, thread_name_prefix="rocketmq-latency") as pool:
        started = time.time()
        futures = []
        for i in range(total):
            delay = started + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one))
        for future in futures:
            future.result(timeout=4 * REQUEST_TIMEOUT_S)
    watcher.wait(list(committed), 60)
    return latency_figure(
        "rocketmq commit-to-visible",
        committed,
        dict(watcher.seen),
        expected=total,
        size=c.size,
        rate=rate,
        duration_s=c.latency_s,
    )
