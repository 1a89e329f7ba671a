"""What the benchmark's steps share (one broker, one coordinator); the steps, in their order, are
:data:`bench.steps.REGISTRY`."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from pathlib import Path

from bench import rocketmq
from bench import txbridge_runs as tb
from bench.kafka_native import CpuMeter, Figure, broker_pid
from bench.steps import MODES, STEPS, Mode, lookup
from servers.coordinator_process import CoordinatorProcess
from txbridge.client_config import ClientConfig
from txbridge.errors import TxBridgeError

__all__ = ["MODES", "BenchRun", "Mode"]

logger = logging.getLogger(__name__)


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
        #: The steps this run takes (``txbridge bench --only/--skip``); every step by default.
        self.selected: frozenset[str] = frozenset(STEPS)
        self._measured: dict[str, Figure] = {}
        self._ns: str | None = None
        self._coordinator: CoordinatorProcess | None = None
        self._broker_pid: int | None = None
        self._broker_looked_up = False  # by the first meter()
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

    def shared_namespace(self) -> str:
        """The namespace served by the shared coordinator, started on first use."""
        if self._ns is None:
            self._ns = self.env.namespace("main")
            self._coordinator = self.env.coordinator(self._ns, "coordinator", "--check-concurrency", "32")
            self._coordinator.start().wait_ready()
        return self._ns

    def meter(self, *, coordinator: bool = False, producer: bool = False) -> CpuMeter:
        """CPU of the local broker (when the run uses it) and, if asked, of the shared coordinator
        and of this process (``producer``: for steps whose producers run here)."""
        if not self._broker_looked_up:
            self._broker_looked_up = True
            self._broker_pid = broker_pid(self.bootstrap)
            if self._broker_pid is None:
                self.progress(
                    f"the broker's CPU is not measured: {self.bootstrap} is no process on this machine"
                )
        pids = {"broker": self._broker_pid}
        if coordinator and self._coordinator is not None:
            pids["coordinator"] = self._coordinator.pid
        if producer:
            pids["producer"] = os.getpid()
        return CpuMeter(pids)

    def will_run(self, step: str) -> bool:
        """Whether this run takes ``step`` (:attr:`selected`)."""
        return step in self.selected

    @property
    def measured(self) -> dict[str, Figure]:
        """Figures a step measured for a later step of this run (the e2e step's floor)."""
        return self._measured

    def half_of_saturated(self) -> float:
        """The open-loop rate of the latency steps: half of e2e's saturated rate (200/s without it)."""
        e2e = next((f for f in self.figures if f.name == "txbridge end to end"), None)
        return max(10.0, (e2e.msgs_per_s if e2e else 400.0) / 2)

    def step(self, name: str) -> Figure:
        """Run the step called ``name`` (:data:`~bench.steps.REGISTRY`); keep and return
        its figure, after any others it measured.

        Raises:
            ValueError: no step is called ``name`` (the message lists those that are).
        """
        figures = lookup(name).run(self)
        self.figures.extend(figures)
        return figures[-1]
