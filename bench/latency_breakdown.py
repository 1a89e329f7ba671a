"""Where txbridge's commit-to-visible time goes at light load, beside native Kafka transactions.

``python -m bench.latency_breakdown [--orders 300] [--rate 20] [--partitions 3]
[--repeats 3] [--variant NAME]``

Each run of a variant has its own namespace and topics (3 partitions, as the demo's; ``--partitions``) and
four child processes, so no two of them share a GIL:

- a coordinator (``coordinator.service.Coordinator``, instrumented by subclassing its public
  seams, ``on_record`` and ``cycle_class``: when its loop receives each op record, when each
  commit boundary begins, produces, sends the offsets and commits);
- a txbridge producer (a blocking ``TransactionProducer``; the local transaction is an SQLite
  commit through ``SqliteBarrier``);
- a native producer (begin, produce, SQLite commit, ``commit_transaction``: the demo's path);
- a watcher: one read_committed consumer per real topic, configured alike.

Both producers send the same orders at the same paced rate (one key per customer, 20
customers) from the same start time. The txbridge path is split at broker and client
timestamps on one host clock:

=====  ===================================================================================
a      local commit done -> the op record's append time (``<ns>_op`` keeps LogAppendTime)
b      op append -> the republished record's CreateTime (the coordinator's ``produce()``)
c      CreateTime -> the read_committed watcher receives the record
whole  local commit done -> the watcher receives the record (``whole_d``: from the insert, just
       before the DB commit, as the demo measures; ``native_d`` likewise)
b1       op append -> the coordinator's loop receives the op record (its fetch)
b2w      received -> its commit boundary begins (its partition's previous commit still ending)
b2p      boundary begun -> produced
c1o      produced -> ``commit_transaction`` called (the rest of the fill: ``<ns>_state`` entries
         and the positions record, then the hand-over to a commit thread)
c1c      the ``commit_transaction`` call
c2       commit returned -> received (the watcher's fetch)
=====  ===================================================================================

Native is split at ``commit_transaction``'s return: the call (n1) and the watcher (n2). Broker and
CreateTime timestamps have millisecond resolution (``a`` can come out slightly negative). The
first ``--warmup`` orders of each path are left out (metadata, first AddPartitionsToTxn).
The variants ``native_late`` (native produces after the DB commit, as the coordinator
produces after a decision, so n1 holds AddPartitionsToTxn and Produce besides EndTxn) and
``native_two_partitions`` (a second record to a one-partition topic, as the coordinator's
positions record) give native the coordinator's shape, so n1 can be set against c1c.
Prints p50 / p99 / mean per part, the p50 ratios, the load average, and the coordinator's
commits, group-consumer fetches per second and CPU per second.

``--saturate N`` checks a variant's cost at high load instead: N transactions of an asyncio
producer, 256 in flight, with a coordinator; transactions/s, the SDK's produce requests per
transaction, the coordinator's fetches per 1,000 transactions and its CPU per transaction.

The machine is usually shared: compare variants within one invocation (``--repeats``
interleaves them) and look at the ratios, whose two sides ran side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from bench.kafka_native import percentile
from bench.txbridge_runs import op_append_times
from txbridge import kafka
from txbridge.wire import H_TX, op_tx_ids

PARTITIONS = 3  # the demo's
CUSTOMERS = 20
_SECRET_ENV = "TXBRIDGE_BREAKDOWN_SECRET"  # noqa: S105 - the variable's name


@dataclass(frozen=True)
class Knobs:
    """The settings one variant changes (None: the code's default)."""

    sdk_extra: Mapping[str, Any] = field(default_factory=dict)  # the SDK producer's extra_config
    op_linger_ms: int | None = None  # txbridge.delivery.URGENT_LINGER_MS: the op records' producer
    coord_linger_ms: int | None = None  # the coordinator's transactional producer
    fetch_wait_ms: int | None = None  # coordinator.group.consumer.FETCH_WAIT_MS
    fetch_min_bytes: int | None = None  # coordinator.group.consumer.FETCH_MIN_BYTES
    coord_extra: Mapping[str, Any] = field(default_factory=dict)  # the coordinator's extra_config
    commit_interval_ms: int = 20
    watch_wait_ms: int = 10  # the watchers' fetch.wait.max.ms (the demo's: 10)
    single_producer: bool = False  # op records on the half records' producer (before URGENT_LINGER_MS)
    # Native transactions also write a small record to a second, one-partition topic, as the
    # coordinator's carry its positions record to <ns>_state: n1 then spans two partitions as c1c does.
    native_two_partitions: bool = False
    # Native produces after the DB commit, as the coordinator produces after the decision: n1 then
    # holds AddPartitionsToTxn and Produce as c1c does, not only EndTxn.
    native_produce_late: bool = False


_LIBRDKAFKA_QUEUE = {"queued.min.messages": 100_000, "fetch.queue.backoff.ms": 1_000}  # its defaults

VARIANTS: dict[str, Knobs] = {
    "base": Knobs(),
    "sdk_linger0": Knobs(sdk_extra={"linger.ms": 0}),
    "op_linger1": Knobs(op_linger_ms=1),
    "op_linger5": Knobs(op_linger_ms=5),
    "single_producer": Knobs(single_producer=True),
    "coord_linger0": Knobs(coord_linger_ms=0),
    "fetch_wait1": Knobs(fetch_wait_ms=1),
    "fetch_wait2": Knobs(fetch_wait_ms=2),
    "fetch_wait100": Knobs(fetch_wait_ms=100),
    "fetch_wait500": Knobs(fetch_wait_ms=500),
    # Fetches at a fixed interval, 5 ms or 64 KiB, where the coordinator's follow the load; and
    # the first record alone (librdkafka's queue settings at their defaults).
    "fetch_5ms_64k": Knobs(coord_extra={**_LIBRDKAFKA_QUEUE, "fetch.min.bytes": 64 * 1024}),
    "fetch_first_record": Knobs(coord_extra=_LIBRDKAFKA_QUEUE),
    "interval50": Knobs(commit_interval_ms=50),
    "interval100": Knobs(commit_interval_ms=100),
    "watch_wait1": Knobs(watch_wait_ms=1),
    "watch_wait100": Knobs(watch_wait_ms=100),
    "native_two_partitions": Knobs(native_two_partitions=True),
    "native_late": Knobs(native_produce_late=True),
    "native_late_two_partitions": Knobs(native_produce_late=True, native_two_partitions=True),
}


@dataclass(frozen=True)
class Spec:
    """One run of one variant (picklable: handed to the spawned children)."""

    bootstrap: str
    namespace: str
    topics: Mapping[str, str]  # path -> real topic
    work: str
    orders: int
    rate: float
    knobs: Knobs
    native_state_topic: str = ""  # with knobs.native_two_partitions
    partitions: int = PARTITIONS  # of the namespace and of both real topics


# ---------------------------------------------------------------------------- coordinator child


@dataclass
class _Timings:
    """What the instrumented coordinator records, put on ``out`` at its end."""

    boundaries: list[dict[str, float]] = field(default_factory=list)
    produced: dict[str, tuple[float, int]] = field(default_factory=dict)  # tx id -> (time, boundary)
    op_seen: dict[str, float] = field(default_factory=dict)
    op_phase: dict[str, str] = field(default_factory=dict)  # tx id -> its phase, waits for a commit
    entered: float = 0.0  # when the current CommitCycle.start call began


class _Timed:
    """A coordinator's transactional producer, timing the calls of each commit boundary."""

    def __init__(self, inner: Any, timings: _Timings) -> None:
        self._inner = inner
        self._timings = timings
        self._current: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def begin_transaction(self) -> None:
        self._current = {"entered": self._timings.entered, "begin": time.time()}
        self._inner.begin_transaction()

    def produce(self, topic: str, **kwargs: Any) -> None:
        tx = dict(kwargs.get("headers") or ()).get(H_TX)
        if tx is not None:
            self._timings.produced.setdefault(tx.decode(), (time.time(), len(self._timings.boundaries)))
        self._inner.produce(topic, **kwargs)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._current["offsets"] = time.time()
        self._inner.send_offsets_to_transaction(*args)

    def commit_transaction(self, *args: Any) -> None:
        self._current["commit"] = time.time()
        self._inner.commit_transaction(*args)
        self._current["committed"] = time.time()
        self._timings.boundaries.append(self._current)


def _time_partition_producers(timings: _Timings, linger: int | None) -> None:
    """Make ``kafka.producer`` hand the coordinator's partition producers out timed.

    The SDK's producers are made in other processes; only transactional ones are wrapped.
    """
    original = kafka.producer

    def producer(bootstrap: str, extra: Any = None, **defaults: Any) -> Any:
        if "transactional_id" not in defaults:
            return original(bootstrap, extra, **defaults)
        if linger is not None:
            defaults["linger_ms"] = linger
        return cast("kafka.Producer", _Timed(original(bootstrap, extra, **defaults), timings))

    kafka.producer = producer


def _instrumented_coordinator(config: Any, timings: _Timings) -> Any:
    """A ``Coordinator`` that notes when its loop receives each op record and begins each boundary."""
    from coordinator import service
    from coordinator.commit.cycle import CommitCycle

    class TimedCycle(CommitCycle):
        def start(self, *, everything: bool) -> None:
            timings.entered = time.time()
            super().start(everything=everything)

    class Instrumented(service.Coordinator):
        cycle_class = TimedCycle

        def on_record(self, msg: Any) -> None:
            is_op = msg.error() is None and msg.topic() == self.topics.op
            tx_ids = op_tx_ids(msg.key(), msg.value()) if is_op else []  # a batch decides several
            for tx_id in tx_ids:
                timings.op_seen.setdefault(tx_id, time.time())
            super().on_record(msg)
            state = self.partitions.get(msg.partition()) if tx_ids else None
            for tx_id in tx_ids:
                tx = state.pending.get(tx_id) if state else None
                phase = f"{tx.phase if tx else None}/{msg.partition() in self.work.ready}"
                timings.op_phase.setdefault(tx_id, phase)

    return Instrumented(config)


def _coordinator_config(spec: Spec, instance: str, fetches: list[int]) -> Any:
    """The coordinator's settings; its statistics keep ``fetches[0]`` at the group consumer's Fetch count."""
    from coordinator.config import CoordinatorConfig, Secrets

    def on_stats(raw: str) -> None:
        body = json.loads(raw)
        if body.get("type") == "consumer" and body.get("client_id") == instance:
            fetches[0] = sum(b.get("req", {}).get("Fetch", 0) for b in body["brokers"].values())

    return CoordinatorConfig(
        bootstrap=spec.bootstrap,
        namespace=spec.namespace,
        group_id=f"{spec.namespace}-coordinator",
        instance_id=instance,
        extra_config={**spec.knobs.coord_extra, "statistics.interval.ms": 500, "stats_cb": on_stats},
        secrets=Secrets(default=os.environ[_SECRET_ENV]),
        check_delay_s=2.0,  # the demo's --check-delay
        commit_interval_ms=spec.knobs.commit_interval_ms,
        log_interval_s=3600.0,
    )


def _run_measured(coordinator: Any, fetches: list[int], ready: Any, stop: Any) -> dict[str, float]:
    """Run ``coordinator`` until ``stop``; its seconds, CPU and fetches from ``ready`` to ``stop``."""
    marks: dict[str, float] = {}

    def signal_ready() -> None:
        if coordinator.running.wait(120):
            time.sleep(1.0)  # a statistics report after the assignment
            marks.update(start=time.monotonic(), cpu=time.process_time(), fetches=fetches[0])
            ready.set()

    def stop_on_request() -> None:
        stop.wait()
        time.sleep(0.6)  # a last statistics report
        marks.update(seconds=time.monotonic() - marks["start"], cpu=time.process_time() - marks["cpu"])
        marks["fetches"] = fetches[0] - marks["fetches"]
        coordinator.stop()

    threading.Thread(target=signal_ready, daemon=True).start()
    threading.Thread(target=stop_on_request, daemon=True).start()
    coordinator.run()
    return marks


def _coordinator_main(spec: Spec, out: Any, ready: Any, stop: Any) -> None:
    """Run an instrumented coordinator until ``stop``; put its timings on ``out``."""
    from coordinator.group import consumer

    knobs = spec.knobs
    if knobs.fetch_wait_ms is not None:
        consumer.FETCH_WAIT_MS = knobs.fetch_wait_ms
    if knobs.fetch_min_bytes is not None:
        consumer.FETCH_MIN_BYTES = knobs.fetch_min_bytes
    timings = _Timings()
    _time_partition_producers(timings, knobs.coord_linger_ms)
    instance = f"breakdown-{uuid.uuid4().hex[:8]}"
    fetches = [0]  # Fetch requests the group consumer (client.id = the instance id) sent so far
    coordinator = _instrumented_coordinator(_coordinator_config(spec, instance, fetches), timings)
    marks = _run_measured(coordinator, fetches, ready, stop)
    out.put(
        {
            "boundaries": timings.boundaries,
            "produced": timings.produced,
            "op_seen": timings.op_seen,
            "op_phase": timings.op_phase,
            "stats": {str(k): v for k, v in coordinator.stats.items()},
            "fetches": marks["fetches"],
            "cpu_s": marks["cpu"],
            "fetches_per_s": marks["fetches"] / marks["seconds"],
            "cpu_per_s": marks["cpu"] / marks["seconds"],
        }
    )


# ---------------------------------------------------------------------------- producer children


#: What a producer reports per committed order: (order, tx id, wall time of the insert (the demo's
#: ``committed_ms``: just before the DB commit), of the DB commit's return, of the call's return).
Row = tuple[int, str, float, float, float]


def _value(order: int) -> bytes:
    return json.dumps({"order": order, "customer": order % CUSTOMERS, "amount": 100 + order}).encode()


def _pace(go_at: float, order: int, rate: float) -> None:
    delay = go_at + order / rate - time.time()
    if delay > 0:
        time.sleep(delay)


def _txbridge_main(spec: Spec, out: Any, go: Any) -> None:
    """A txbridge producer: half record, SQLite commit, op record; one transaction per order."""
    from txbridge import Message, SqliteBarrier, TransactionProducer, TxState, delivery

    if spec.knobs.op_linger_ms is not None:
        delivery.URGENT_LINGER_MS = spec.knobs.op_linger_ms
    if spec.knobs.single_producer:
        _single_producer()
    barrier = SqliteBarrier(str(Path(spec.work) / "txbridge.db"))
    producer = TransactionProducer(
        spec.bootstrap,
        f"{spec.namespace}-orders",
        secret=os.environ[_SECRET_ENV],
        check=barrier.check,
        namespace=spec.namespace,
        partitions=spec.partitions,
        extra_config=dict(spec.knobs.sdk_extra),
    )
    rows: list[Row] = []
    with producer:
        with barrier.local_transaction("warm-up") as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, body BLOB)")
        out.put("ready")
        go_at = go.get()
        times = [0.0, 0.0]  # the last local transaction: its insert done, its commit returned

        def execute(txn: Any, number: int) -> TxState:
            with barrier.local_transaction(txn.tx_id) as conn:
                conn.execute("INSERT INTO orders VALUES (?, ?)", (number, _value(number)))
                times[0] = time.time()
            times[1] = time.time()
            return TxState.COMMIT

        for order in range(spec.orders):
            _pace(go_at, order, spec.rate)

            message = Message(
                spec.topics["txbridge"], _value(order), key=f"customer-{order % CUSTOMERS}".encode()
            )
            result = producer.send_in_transaction(message, execute, order)
            if result.state is TxState.COMMIT and result.error is None:
                rows.append((order, result.tx_id, times[0], times[1], time.time()))
    out.put(rows)


def _native_main(spec: Spec, out: Any, go: Any) -> None:
    """Native Kafka transactions as the demo's path: begin, produce, SQLite commit, commit."""
    producer = kafka.producer(
        spec.bootstrap, {}, transactional_id=f"{spec.namespace}-native", transaction_timeout_ms=60_000
    )
    producer.init_transactions(30)
    db = sqlite3.connect(str(Path(spec.work) / "native.db"), isolation_level=None)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, body BLOB)")
    rows: list[Row] = []
    out.put("ready")
    go_at = go.get()
    topic = spec.topics["native"]
    for order in range(spec.orders):
        _pace(go_at, order, spec.rate)
        producer.begin_transaction()
        if not spec.knobs.native_produce_late:
            _native_produce(producer, spec, topic, order)
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO orders VALUES (?, ?)", (order, _value(order)))
        inserted = time.time()
        db.execute("COMMIT")
        committed = time.time()
        if spec.knobs.native_produce_late:
            _native_produce(producer, spec, topic, order)
        producer.commit_transaction(30)
        rows.append((order, "", inserted, committed, time.time()))
    producer.flush(30)
    db.close()
    out.put(rows)


def _native_produce(producer: Any, spec: Spec, topic: str, order: int) -> None:
    producer.produce(topic, key=f"customer-{order % CUSTOMERS}", value=_value(order))
    if spec.native_state_topic:  # about the size of the coordinator's positions record
        producer.produce(spec.native_state_topic, key=b"0", value=b"{" + b"0" * 60 + b"}", partition=0)


# ---------------------------------------------------------------------------- watcher child


def _watch_main(spec: Spec, out: Any, ready: Any, stop: Any) -> None:
    """One read_committed consumer per real topic (the same settings); puts (path, order, seen, create)."""

    def watch(path: str, topic: str, assigned: threading.Event) -> None:
        consumer = kafka.consumer(
            spec.bootstrap,
            f"breakdown-watch-{uuid.uuid4().hex[:8]}",
            fetch_wait_max_ms=spec.knobs.watch_wait_ms,
        )
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in range(spec.partitions)])
        consumer.consume(1, 0.5)  # connects and fetches once before the first order
        assigned.set()
        try:
            while not stop.is_set():
                batch = []
                for msg in kafka.consume_available(consumer, 500, 0.05):
                    if msg.error() is None:
                        seen = time.time()
                        batch.append((path, json.loads(msg.value())["order"], seen, msg.timestamp()[1]))
                if batch:
                    out.put(batch)
        finally:
            consumer.close()

    events = {path: threading.Event() for path in spec.topics}
    threads = [
        threading.Thread(target=watch, args=(path, topic, events[path]), daemon=True)
        for path, topic in spec.topics.items()
    ]
    for thread in threads:
        thread.start()
    for event in events.values():
        event.wait(60)
    ready.set()
    for thread in threads:
        thread.join()
    out.put(None)


# ---------------------------------------------------------------------------- one run


#: The table's parts: txbridge's a, b, c and whole, native's whole (see the module docstring), and
#: both wholes from just before the DB commit (``_d``: where the demo's latency starts).
MAIN = ("a", "b", "c", "whole", "native", "whole_d", "native_d")
#: b1; b2 as the wait for a boundary (b2w) and its start (b2p); c1 as the rest of the boundary up
#: to commit_transaction (c1o: the rest of the fill and the hand-over to a commit thread; the
#: positions go in a <ns>_state record, not send_offsets_to_transaction) and the commit call itself
#: (c1c); c2; native's commit call (n1) and its watcher (n2).
DETAIL = ("b1", "b2w", "b2p", "c1o", "c1c", "c2", "n1", "n2")


@dataclass
class RunResult:
    """One run's samples: ``parts`` maps a part (:data:`MAIN`, :data:`DETAIL`) to ms per order."""

    variant: str
    parts: dict[str, list[float]]
    load: str
    lost: dict[str, int]
    coordinator: dict[str, int]


def run_once(
    bootstrap: str,
    variant: str,
    knobs: Knobs,
    *,
    orders: int,
    rate: float,
    warmup: int,
    partitions: int = PARTITIONS,
) -> RunResult:
    """One side-by-side run of ``variant``: its own namespace and topics, deleted afterwards."""
    from txbridge.topics import init_topics

    run = uuid.uuid4().hex[:8]
    namespace = f"__txb_breakdown_{run}"
    topics = {"txbridge": f"breakdown-{run}-txbridge", "native": f"breakdown-{run}-native"}
    init_topics(bootstrap, namespace, partitions)
    state_topic = f"breakdown-{run}-native-state" if knobs.native_two_partitions else ""
    kafka.ensure_topics(
        bootstrap,
        [kafka.TopicSpec(t, partitions) for t in topics.values()]
        + ([kafka.TopicSpec(state_topic, 1)] if state_topic else []),
    )
    work = tempfile.mkdtemp(prefix=f"txbridge-breakdown-{run}-")
    spec = Spec(bootstrap, namespace, topics, work, orders, rate, knobs, state_topic, partitions)
    os.environ.setdefault(_SECRET_ENV, os.urandom(16).hex())  # children inherit it; never on argv
    ctx = multiprocessing.get_context("spawn")
    coord_out, coord_ready, coord_stop = ctx.Queue(), ctx.Event(), ctx.Event()
    watch_out, watch_ready, watch_stop = ctx.Queue(), ctx.Event(), ctx.Event()
    outs = {path: ctx.Queue() for path in topics}
    gos = {path: ctx.Queue() for path in topics}
    mains: dict[str, Callable[[Spec, Any, Any], None]] = {"txbridge": _txbridge_main, "native": _native_main}
    procs = [
        ctx.Process(
            target=_coordinator_main, args=(spec, coord_out, coord_ready, coord_stop), name="coordinator"
        ),
        ctx.Process(target=_watch_main, args=(spec, watch_out, watch_ready, watch_stop), name="watcher"),
        *(ctx.Process(target=mains[p], args=(spec, outs[p], gos[p]), name=p) for p in topics),
    ]
    seen: dict[tuple[str, int], tuple[float, int]] = {}
    try:
        for proc in procs:
            proc.start()
        _wait(coord_ready, procs, 120)
        _wait(watch_ready, procs, 60)
        for path in topics:
            if _get(outs[path], procs, 120) != "ready":
                raise RuntimeError(f"the {path} producer did not start")
        go_at = time.time() + 0.5
        for path in topics:
            gos[path].put(go_at)
        sent = {path: _get(outs[path], procs, orders / rate + 300) for path in topics}
        expected = sum(len(rows) for rows in sent.values())
        deadline = time.monotonic() + 30
        while len(seen) < expected and time.monotonic() < deadline:
            try:
                batch = watch_out.get(timeout=0.5)
            except queue.Empty:
                continue
            for path, order, at, created in batch or ():
                seen.setdefault((path, order), (at, created))
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        coord_stop.set()
        coordinator = _get(coord_out, procs, 60)
        op_times = op_append_times(bootstrap, f"{namespace}_op", partitions)
        appended = {tx: round(at * 1000) for tx, at in op_times.items()}
    finally:
        watch_stop.set()
        coord_stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        kafka.delete_topics_with_prefix(bootstrap, namespace)
        kafka.delete_topics_with_prefix(bootstrap, f"breakdown-{run}-")
    return _split(
        variant, sent=sent, seen=seen, appended=appended, coordinator=coordinator, load=load, warmup=warmup
    )


def _get(source: Any, procs: list[Any], timeout: float) -> Any:
    """``source.get()``, failing at once when a child process died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return source.get(timeout=1.0)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"no answer from a child process (failed: {dead})") from None


def _wait(event: Any, procs: list[Any], timeout: float) -> None:
    """``event.wait()``, failing at once when a child process died."""
    deadline = time.monotonic() + timeout
    while not event.wait(1.0):
        dead = [p.name for p in procs if p.exitcode not in (None, 0)]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"a child process did not start (failed: {dead})")


def _split(
    variant: str,
    *,
    sent: Mapping[str, list[Row]],
    seen: Mapping[tuple[str, int], tuple[float, int]],
    appended: Mapping[str, int],
    coordinator: Mapping[str, Any],
    load: str,
    warmup: int,
) -> RunResult:
    """Per-order parts in ms (see the module's table)."""
    parts: dict[str, list[float]] = {k: [] for k in (*MAIN, *DETAIL)}
    boundaries, produced, op_seen = coordinator["boundaries"], coordinator["produced"], coordinator["op_seen"]
    lost = {path: 0 for path in sent}
    for order, tx, inserted, committed, _returned in sent["txbridge"]:
        visible = seen.get(("txbridge", order))
        if visible is None:
            lost["txbridge"] += 1
            continue
        if order < warmup or tx not in appended or tx not in produced or tx not in op_seen:
            continue
        at, created = visible
        op_at, received = appended[tx] / 1000, op_seen[tx]
        produced_at, index = produced[tx]
        nan = {"begin": math.nan, "commit": math.nan, "committed": math.nan}
        boundary = boundaries[index] if index < len(boundaries) else nan
        created_s = created / 1000
        for name, value in (
            ("a", op_at - committed),
            ("b", created_s - op_at),
            ("c", at - created_s),
            ("whole", at - committed),
            ("whole_d", at - inserted),
            ("b1", received - op_at),
            ("b2w", boundary["begin"] - received),
            ("b2p", produced_at - boundary["begin"]),
            ("c1o", boundary["commit"] - produced_at),
            ("c1c", boundary["committed"] - boundary["commit"]),
            ("c2", at - boundary["committed"]),
        ):
            parts[name].append(value * 1000)
    for order, _tx, inserted, committed, returned in sent["native"]:
        visible = seen.get(("native", order))
        if visible is None:
            lost["native"] += 1
            continue
        if order < warmup:
            continue
        at = visible[0]
        parts["native"].append((at - committed) * 1000)
        parts["native_d"].append((at - inserted) * 1000)
        parts["n1"].append((returned - committed) * 1000)
        parts["n2"].append((at - returned) * 1000)
    stats = coordinator.get("stats", {})
    kept = {k: int(stats.get(k, 0)) for k in ("kafka_transactions", "resolved_published", "kafka_aborts")}
    kept["fetches_per_s"] = round(coordinator["fetches_per_s"])
    kept["cpu_ms_per_s"] = round(coordinator["cpu_per_s"] * 1000)
    return RunResult(variant, parts, load, lost, kept)


# ---------------------------------------------------------------------------- report


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{percentile(ordered, 50):.1f}/{percentile(ordered, 99):.0f}/{statistics.fmean(values):.1f}"


def _ratio(txbridge: list[float], native: list[float]) -> float:
    if not txbridge or not native:
        return math.nan
    return percentile(sorted(txbridge), 50) / percentile(sorted(native), 50)


def render(results: list[RunResult], columns: tuple[str, ...] = MAIN) -> str:
    """A markdown table: one row per run, p50/p99/mean ms per part, and the p50 ratio."""
    head = [
        "variant",
        *columns,
        "ratio p50",
        "ratio_d p50",
        "load 1/5/15",
        "commits",
        "fetches/s",
        "CPU ms/s",
        "lost",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for result in results:
        ratios = [
            _ratio(result.parts[t], result.parts[n])
            for t, n in (("whole", "native"), ("whole_d", "native_d"))
        ]
        lost = "/".join(str(v) for v in result.lost.values())
        cells = [
            result.variant,
            *(_cell(result.parts[c]) for c in columns),
            *(f"{r:.2f}" for r in ratios),
            result.load,
            str(result.coordinator.get("kafka_transactions", 0)),
            str(result.coordinator.get("fetches_per_s", "")),
            str(result.coordinator.get("cpu_ms_per_s", "")),
            lost,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- saturation check


def _single_producer() -> None:
    """Make the producers write op records with the half records' producer (as before)."""
    from txbridge import delivery
    from txbridge.producer import runtime as _runtime

    class Single(delivery.DeliveryPump):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("urgent_topics", None)
            super().__init__(*args, **kwargs)

    _runtime.DeliveryPump = Single  # type: ignore[misc]


def _saturate_main(spec: Spec, out: Any) -> None:
    """The asyncio SDK producer at saturation: transactions/s and produce requests per transaction."""
    import asyncio

    from txbridge import AsyncTransactionProducer, Message, TxState, delivery

    if spec.knobs.single_producer:
        _single_producer()
    if spec.knobs.op_linger_ms is not None:
        delivery.URGENT_LINGER_MS = spec.knobs.op_linger_ms
    stats: dict[str, dict[str, Any]] = {}

    def on_stats(raw: str) -> None:
        body = json.loads(raw)
        if body.get("type") == "producer":
            stats[body["name"]] = body

    extra = {**spec.knobs.sdk_extra, "statistics.interval.ms": 500, "stats_cb": on_stats}

    async def main() -> float:
        producer = AsyncTransactionProducer(
            spec.bootstrap,
            f"{spec.namespace}-orders",
            secret=os.environ[_SECRET_ENV],
            check=lambda _txn: TxState.COMMIT,
            namespace=spec.namespace,
            partitions=12,
            extra_config=extra,
        )
        async with producer:
            pending = iter(range(spec.orders))
            started = time.monotonic()

            async def worker() -> None:
                for order in pending:
                    message = Message(spec.topics["txbridge"], _value(order), key=f"k{order % 4096}".encode())
                    await producer.send_in_transaction(message, lambda _t, _a: TxState.COMMIT)

            await asyncio.gather(*(worker() for _ in range(256)))
            elapsed = time.monotonic() - started
            await asyncio.sleep(1.2)  # a last statistics report
        return elapsed

    elapsed = asyncio.run(main())
    produce = sum(
        broker.get("req", {}).get("Produce", 0)
        for body in stats.values()
        for broker in body["brokers"].values()
    )
    out.put({"elapsed": elapsed, "produce_requests": produce, "producers": len(stats)})


def saturate(bootstrap: str, variant: str, knobs: Knobs, *, count: int) -> str:
    """One saturation run of ``variant`` (its own namespace; 12 partitions as ``txbridge bench``)."""
    from txbridge.topics import init_topics

    run = uuid.uuid4().hex[:8]
    namespace = f"__txb_breakdown_{run}"
    topic = f"breakdown-{run}-txbridge"
    init_topics(bootstrap, namespace, 12)
    kafka.ensure_topics(bootstrap, [kafka.TopicSpec(topic, 6)])
    spec = Spec(bootstrap, namespace, {"txbridge": topic}, "", count, 0.0, knobs)
    os.environ.setdefault(_SECRET_ENV, os.urandom(16).hex())
    ctx = multiprocessing.get_context("spawn")
    out, coord_out, coord_ready, coord_stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    coordinator = ctx.Process(
        target=_coordinator_main, args=(spec, coord_out, coord_ready, coord_stop), name="coordinator"
    )
    proc = ctx.Process(target=_saturate_main, args=(spec, out), name="saturate")
    procs = [coordinator, proc]
    try:
        coordinator.start()
        _wait(coord_ready, procs, 120)
        proc.start()
        figures = _get(out, procs, 600)
        time.sleep(2.0)  # the coordinator publishes the last transactions
        coord_stop.set()
        coord = _get(coord_out, procs, 60)
    finally:
        coord_stop.set()
        for child in procs:
            child.join(30)
            if child.is_alive():
                child.kill()
        kafka.delete_topics_with_prefix(bootstrap, namespace)
        kafka.delete_topics_with_prefix(bootstrap, f"breakdown-{run}-")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    rate = count / figures["elapsed"]
    per_tx = figures["produce_requests"] / count
    published = coord["stats"].get("resolved_published", 0)
    fetches = coord["fetches"] / count * 1000
    cpu = coord["cpu_s"] / count * 1e6
    return (
        f"| {variant} | {rate:,.0f} | {per_tx:.2f} | {figures['producers']} | {published} | "
        f"{fetches:.0f} | {cpu:.0f} | {coord['fetches_per_s']:.0f} | {load} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency_breakdown", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--orders", type=int, default=300, help="orders per path and run")
    parser.add_argument("--rate", type=float, default=20.0, help="orders per second per path")
    parser.add_argument("--warmup", type=int, default=20, help="first orders of each run left out")
    parser.add_argument(
        "--partitions", type=int, default=PARTITIONS, help="of the namespace and both topics (bench: 12)"
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--variant", action="append", choices=sorted(VARIANTS), help="repeatable; default: all"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    parser.add_argument(
        "--saturate",
        type=int,
        default=0,
        metavar="N",
        help="instead: N transactions of the asyncio SDK producer, 256 in flight, with a coordinator, "
        "per variant (transactions/s, produce requests per transaction, the coordinator's fetches and CPU)",
    )
    args = parser.parse_args(argv)
    names = args.variant or list(VARIANTS)
    if args.saturate:
        print(
            "| variant | transactions/s | produce requests / transaction | producers | published "
            "| coordinator fetches / 1000 tx | coordinator CPU µs / tx | fetches/s | load 1/5/15 |"
        )
        print("|" + " --- |" * 9)
        for repeat in range(args.repeats):
            for name in names:
                line = saturate(args.bootstrap, f"{name} #{repeat + 1}", VARIANTS[name], count=args.saturate)
                print(line, flush=True)
        return
    results: list[RunResult] = []
    for repeat in range(args.repeats):
        for name in names:
            result = run_once(
                args.bootstrap,
                name,
                VARIANTS[name],
                orders=args.orders,
                rate=args.rate,
                warmup=args.warmup,
                partitions=args.partitions,
            )
            result = replace(result, variant=f"{name} #{repeat + 1}")
            results.append(result)
            print(render([result]).splitlines()[-1], flush=True)
    print("\np50/p99/mean ms per part (module docstring):\n" + render(results))
    print("\ndetail:\n" + render(results, DETAIL))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results]))


if __name__ == "__main__":
    main()
