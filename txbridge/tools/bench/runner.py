"""The order of the benchmark's steps and what they share (one broker, one coordinator)."""

from __future__ import annotations

import logging
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from txbridge.client_config import ClientConfig
from txbridge.errors import TxBridgeError
from txbridge.tools.bench import node_kill, rocketmq, scaleout
from txbridge.tools.bench import txbridge_runs as tb
from txbridge.tools.bench.floor import floor, floor_latency
from txbridge.tools.bench.kafka_native import CpuMeter, Figure, native_transactions, raw_produce
from txbridge.tools.bench.steps import STEPS
from txbridge.tools.local.coordinator_process import CoordinatorProcess

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mode:
    raw_count: int
    native_s: float
    e2e_count: int
    latency_s: float
    checks: int
    pending: int


MODES = {
    "quick": Mode(
        raw_count=50_000, native_s=5.0, e2e_count=3_000, latency_s=5.0, checks=1_000, pending=10_000
    ),
    "full": Mode(
        raw_count=500_000, native_s=20.0, e2e_count=30_000, latency_s=20.0, checks=10_000, pending=100_000
    ),
}


class BenchRun:
    """One benchmark invocation: its namespace, its shared coordinator, its figures."""

    def __init__(
        self,
        bootstrap: str,
        mode: Mode,
        *,
        size: int,
        concurrency: int,
        in_flight: int,
        keep_topics: bool = False,
        client: ClientConfig | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.client = client or ClientConfig()
        self.extra = self.client.librdkafka()
        self.keep_topics = keep_topics
        self.mode = mode
        self.size = size
        self.concurrency = concurrency
        self.in_flight = in_flight
        run_id = uuid.uuid4().hex[:8]
        work = Path(tempfile.mkdtemp(prefix=f"txbridge-bench-{run_id}-"))
        self.env = tb.Env(bootstrap, run_id, work, client=self.client)
        self.figures: list[Figure] = []
        self._ns: str | None = None
        self._coordinator: CoordinatorProcess | None = None
        #: Where the rocketmq step finds RocketMQ (default: it starts a local one) and its progress lines.
        self.rocketmq = rocketmq.RocketMQOptions(keep_topics=keep_topics)
        self.progress: rocketmq.Progress = logger.info

    def __enter__(self) -> BenchRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._coordinator is not None:
            self._coordinator.stop()
        if self.keep_topics:
            return
        try:
            deleted = self.env.delete_topics()
        except TxBridgeError as error:
            logger.warning(
                "could not delete this run's topics (%s); delete the topics starting with %s by hand",
                error,
                " or ".join(self.env.topic_prefixes),
            )
        else:
            logger.info("deleted this run's %d topics", len(deleted))

    def _shared_namespace(self) -> str:
        """The namespace served by the shared coordinator, started on first use."""
        if self._ns is None:
            self._ns = self.env.namespace("main")
            self._coordinator = self.env.coordinator(self._ns, "coordinator", "--check-concurrency", "32")
            self._coordinator.start().wait_ready()
        return self._ns

    def _topic(self, name: str) -> str:
        return self.env.topic(name)

    def _meter(self, *, coordinator: bool = False) -> CpuMeter:
        """CPU of the local broker (when the run uses it) and, if asked, of the shared coordinator."""
        from txbridge.tools.local.broker import LocalKafka

        status = LocalKafka.from_home().status()
        pids = {"broker": status.pid if status.running and status.bootstrap == self.bootstrap else None}
        if coordinator and self._coordinator is not None:
            pids["coordinator"] = self._coordinator.pid
        return CpuMeter(pids)

    def _half_of_saturated(self) -> float:
        e2e = next((f for f in self.figures if f.name == "txbridge end to end"), None)
        return max(10.0, (e2e.msgs_per_s if e2e else 400.0) / 2)

    def step(self, name: str) -> Figure:  # noqa: PLR0912 - one branch per step, in the order they run
        m, size = self.mode, self.size
        if name == "raw":
            figure = raw_produce(
                self.bootstrap,
                self._topic("raw"),
                size=size,
                count=m.raw_count,
                meter=self._meter(),
                extra=self.extra,
            )
        elif name in ("native1", "native100"):
            per_txn = 1 if name == "native1" else 100
            figure = native_transactions(
                self.bootstrap,
                self._topic(name),
                size=size,
                per_txn=per_txn,
                duration_s=m.native_s,
                concurrency=self.concurrency if per_txn == 1 else 2,
                meter=self._meter(),
                extra=self.extra,
            )
        elif name == "e2e":
            ns = self._shared_namespace()  # starts the coordinator, whose CPU the meter reads
            figure = tb.end_to_end(
                self.env,
                ns,
                size=size,
                count=m.e2e_count,
                concurrency=self.in_flight,
                meter=self._meter(coordinator=True),
            )
        elif name == "floor":
            # The same Kafka I/O as txbridge end to end with no txbridge logic: the best any
            # Python implementation of the protocol reaches here (what the ratios are up against).
            _producer_side, figure = floor(
                self.bootstrap,
                size=size,
                count=m.e2e_count,
                in_flight=self.in_flight,
                meter=self._meter(),
                extra=self.extra,
            )
        elif name == "latency":
            figure = tb.latency(
                self.env,
                self._shared_namespace(),
                size=size,
                rate=self._half_of_saturated(),
                duration_s=m.latency_s,
            )
        elif name == "floor_latency":
            # The floor's Kafka I/O at txbridge's latency rate: the two latency rows compare directly.
            figure = floor_latency(
                self.bootstrap,
                size=size,
                rate=self._half_of_saturated(),
                duration_s=m.latency_s,
                extra=self.extra,
            )
        elif name == "checks":
            figure = tb.backcheck_drain(self.env, size=size, count=m.checks, concurrency=self.in_flight)
        elif name == "memory":
            figure = tb.memory(self.env, size=size, pending=m.pending, cache_bytes=16 * 2**20)
        elif name in ("failover", "restart"):
            # failover: a kill at a random moment, then one that leaves its Kafka transaction open.
            runs = (
                tb.failovers(self.env, size=size) if name == "failover" else [tb.restart(self.env, size=size)]
            )
            *before, figure = runs
            self.figures.extend(before)
        elif name in ("scaleout", "addremove"):
            # The same workload through 1, 2 (and 4) coordinators; one added and one SIGTERMed under load.
            *before, figure = scaleout.run(
                name, self.env, quick=m == MODES["quick"], size=size, in_flight=self.in_flight
            )
            self.figures.extend(before)
        elif name == "nodekill":
            # On a secured 3-node cluster of its own, whatever the run's bootstrap: nodes SIGKILLed
            # under txbridge and under native transactions at the same rate.
            figure = node_kill.run(
                node_kill.OPTIONS["quick" if m == MODES["quick"] else "full"],
                self.env.work,
                size=size,
                progress=self.progress,
            )
        elif name == "rocketmq":
            # The real RocketMQ with txbridge's message size and in-flight count; its figures come first.
            *before, figure = rocketmq.run(
                self.rocketmq,
                rocketmq.Comparison(size, self.in_flight, m.native_s, m.latency_s, self._half_of_saturated()),
                self.env.work,
                txbridge_latency=lambda rate: tb.latency(
                    self.env, self._shared_namespace(), size=size, rate=rate, duration_s=m.latency_s
                ),
                progress=self.progress,
            )
            self.figures.extend(before)
        else:
            raise ValueError(f"unknown benchmark step {name!r}; known: {STEPS}")
        self.figures.append(figure)
        return figure
