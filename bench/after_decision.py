"""A bare Kafka transaction begun after the decision: what no republisher over Kafka transactions
can shed, timed beside RocketMQ and txbridge at RocketMQ's rate (the bench's rocketmq step)."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from bench.kafka_native import (
    NO_METER,
    BenchError,
    CpuMeter,
    Figure,
    payload,
    started_at,
)
from bench.txbridge_runs import Watcher, watched_latency
from txbridge.wire import H_TX

#: Transactional producers of :func:`after_decision_latency`: enough that an open loop at a few
#: hundred transactions a second never waits for a free one (each takes a few ms).
AFTER_DECISION_PRODUCERS = 8


class _AfterDecision:
    """Transactional producers on threads, each taking the next transaction off a queue."""

    def __init__(self, bootstrap: str, topic: str, state_topic: str, value: bytes, extra: Any) -> None:
        self._args = (bootstrap, topic, state_topic, value, extra)
        self._run = uuid.uuid4().hex[:8]
        self._work: queue.Queue[int | None] = queue.Queue()
        self._ready = threading.Barrier(AFTER_DECISION_PRODUCERS + 1)
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True)
            for i in range(AFTER_DECISION_PRODUCERS)
        ]
        self.decided: dict[str, float] = {}
        self.errors: list[BaseException] = []

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        try:
            self._ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            raise BenchError(f"a transactional producer could not start: {self.errors[:1]!r}") from None

    def run(self, total: int, rate: float) -> None:
        """Hand out ``total`` transactions at ``rate`` a second, whatever the others do; wait for all."""
        started = time.time()
        for i in range(total):
            delay = started + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            self._work.put(i)
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()
        if self.errors:
            raise BenchError(f"a transaction after the decision failed: {self.errors[0]!r}")

    def _worker(self, index: int) -> None:
        bootstrap, topic, state_topic, value, extra = self._args
        producer = started_at(
            self._ready, self.errors, bootstrap, extra, f"bench-decided-{self._run}-{index}"
        )
        if producer is None:
            return
        while (item := self._work.get()) is not None:
            tx = f"{self._run}-{item}"
            try:
                producer.begin_transaction()
                began = time.time()
                producer.produce(topic, value=value, key=str(item % 4096).encode(), headers=[(H_TX, tx)])
                producer.produce(state_topic, value=b"{" + b"0" * 60 + b"}", key=b"0", partition=0)
                producer.commit_transaction(30)
                self.decided[tx] = began
            except BaseException as exc:  # reported by run(): a silent failure would read as a loss
                self.errors.append(exc)


def after_decision_latency(
    bootstrap: str,
    topic: str,
    state_topic: str,
    *,
    size: int,
    rate: float,
    duration_s: float,
    extra: Mapping[str, Any] | None = None,
    meter: CpuMeter = NO_METER,
) -> Figure:
    """A Kafka transaction begun after the decision, open loop at ``rate``: decision to visible.

    What any republisher that keeps Kafka's exactly-once pays once it knows a transaction
    committed, with none of txbridge's own work: begin, produce the message to ``topic`` and a
    small record to the one-partition ``state_topic`` (as the coordinator writes its positions),
    ``commit_transaction``. The clock starts before the first produce and stops when a
    read_committed consumer sees the message. txbridge's commit-to-visible holds this and the op
    record's trip to the coordinator. ``meter``'s processes' CPU over the open loop goes into the
    figure, per message.

    Raises:
        BenchError: a producer failed, or some committed messages never became visible.
    """
    total = max(1, int(rate * duration_s))
    loop = _AfterDecision(bootstrap, topic, state_topic, payload(size), extra)
    loop.start()  # the producers wait for work: nothing is produced before the watcher reads

    def drive() -> dict[str, float]:
        loop.run(total, rate)
        return loop.decided

    figure = watched_latency(
        "kafka txn after decision (RocketMQ's rate)",
        Watcher(bootstrap, topic, extra).start(),
        drive,
        meter,
        total=total,
        size=size,
        rate=rate,
        duration_s=duration_s,
    )
    figure.params["producers"] = AFTER_DECISION_PRODUCERS
    figure.params["clock_starts"] = "before the transaction's first produce"
    return figure
