"""Run the workload on every path at once: topics, watchers, producer processes, settling.

The ``rocketmq`` path needs its RocketMQ prepared first (``spark_pipelines/rocketmq.py``:
the topic and the watcher's group) and the endpoint in ``RunConfig.rocketmq_endpoint``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from servers.coordinator_process import CoordinatorProcess, CoordinatorProcessError
from spark_pipelines.faults import FaultPlan
from spark_pipelines.paths import CHECKED_PATHS, KAFKA_PATHS, PATHS, ROCKETMQ
from spark_pipelines.processes import PathResult, ProducerRunner, StartLine
from spark_pipelines.watcher import RocketMQWatcher, VisibilityWatcher
from spark_pipelines.workload import RunConfig
from txbridge import kafka

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)

ISOLATIONS = ("read_committed", "read_uncommitted")


@dataclass
class WorkloadResult:
    """What the run did: per-path results, where visibility was saved, how long settling took."""

    paths: dict[str, PathResult] = field(default_factory=dict)
    visibility: dict[tuple[str, str], Path] = field(default_factory=dict)
    settle_s: float = 0.0
    #: every committed order of the checked paths (txbridge, rocketmq) became visible in time
    settled: bool = True
    #: per checked path: committed orders still not visible when settling ended
    unsettled: dict[str, int] = field(default_factory=dict)
    #: per path read from a consumer's record instead of a topic (rocketmq): that record
    received: dict[str, Path] = field(default_factory=dict)
    #: the RocketMQ watcher's own counts: records, undecodable, receive and ack errors
    rocketmq_watcher: dict[str, int] = field(default_factory=dict)
    coordinator_kills: int = 0
    #: (SIGKILL, ready again) wall times of each coordinator restart
    coordinator_outages: list[tuple[float, float]] = field(default_factory=list)
    #: exit codes of the coordinator's exits the run did not cause (it was started again each time)
    coordinator_exits: list[int | None] = field(default_factory=list)


def prepare(config: RunConfig, paths: Sequence[str] = PATHS, *, client: ClientConfig | None = None) -> None:
    """Create the run's folders, topics and tables (idempotent); ``client``: the cluster's settings."""
    run_dir = Path(config.run_dir)
    (run_dir / "db").mkdir(parents=True, exist_ok=True)
    specs = [kafka.TopicSpec(config.topics[p], config.partitions) for p in paths if p in KAFKA_PATHS]
    if specs:
        extra = client.librdkafka() if client is not None else None
        kafka.ensure_topics(config.bootstrap, specs, extra=extra)
    if "txbridge" in paths:
        from txbridge.topics import init_topics

        init_topics(config.bootstrap, config.namespace, config.partitions, client_config=client)
    for path in paths:
        store = config.store(path)
        store.create()
        store.dispose()
    config.save()


def run_workload(
    config: RunConfig,
    plan: FaultPlan,
    *,
    secret: str | None = None,
    coordinator: CoordinatorProcess | None = None,
    paths: Sequence[str] = PATHS,
    settle_timeout: float = 90.0,
    quiet_s: float = 1.0,
    on_order: Callable[[str, int, str], None] | None = None,
    client: ClientConfig | None = None,
) -> WorkloadResult:
    """Run ``plan`` through ``paths`` concurrently, one producer process chain per path.

    The coordinator (txbridge) is killed and restarted after order
    ``plan.coordinator_kill_after``. After the last order the run waits up to
    ``settle_timeout`` seconds for the back-checks of txbridge and RocketMQ to publish
    every committed order, then ``quiet_s`` more (a late duplicate shows up), then
    stops the producers and watchers.

    ``client`` holds the cluster's client settings: every producer process, watcher and
    topic creation uses them.

    Raises:
        PipelineError: a producer process failed outside the plan.
    """
    prepare(config, paths, client=client)
    config.plan_file.write_text(plan.to_json())
    watchers = _watchers(config, paths, client)
    restarts: list[threading.Thread] = []

    def observe(path: str, index: int, outcome: str) -> None:
        if path == "txbridge" and coordinator is not None and index == plan.coordinator_kill_after:
            thread = threading.Thread(
                target=_crash_and_restart, args=(coordinator,), name="coordinator-restart"
            )
            thread.start()
            restarts.append(thread)
        if on_order:
            on_order(path, index, outcome)

    start_line = StartLine(len(paths))
    runners = {
        p: ProducerRunner(
            config, p, plan, secret=secret, on_order=observe, client=client, start_line=start_line
        )
        for p in paths
    }
    result = WorkloadResult()
    try:
        with ThreadPoolExecutor(len(watchers) or 1) as pool:  # each waits for its first fetch
            for started in [pool.submit(w.start) for w in watchers.values()]:
                started.result()
        with ThreadPoolExecutor(len(runners)) as pool:
            futures = {p: pool.submit(r.run) for p, r in runners.items()}
            result.paths = {p: f.result() for p, f in futures.items()}
        for thread in restarts:
            thread.join(60)
        result.settle_s, result.unsettled = _settle(config, paths, watchers, settle_timeout, quiet_s)
        result.settled = not any(result.unsettled.values())
        for runner in runners.values():
            runner.finish()
    finally:
        for runner in runners.values():
            runner.kill()
        for watcher in watchers.values():
            watcher.stop()
    _save_watched(config, watchers, result)
    if coordinator is not None:
        result.coordinator_kills = coordinator.kills
        result.coordinator_outages = list(coordinator.outages)
        result.coordinator_exits = [code for _, code, _ in coordinator.exits]
    return result


def _watchers(
    config: RunConfig, paths: Sequence[str], client: ClientConfig | None
) -> dict[tuple[str, str], VisibilityWatcher | RocketMQWatcher]:
    """A watcher per Kafka path and isolation level, and one for RocketMQ (not started)."""
    settings = client.librdkafka() if client is not None else None
    watchers: dict[tuple[str, str], VisibilityWatcher | RocketMQWatcher] = {
        (p, iso): VisibilityWatcher(config.bootstrap, config.topics[p], iso, settings)
        for p in paths
        if p in KAFKA_PATHS
        for iso in ISOLATIONS
    }
    if ROCKETMQ in paths:
        # RocketMQ has no isolation levels: a consumer only ever sees committed transactions.
        watchers[(ROCKETMQ, "read_committed")] = RocketMQWatcher(
            config.rocketmq_endpoint, config.topics[ROCKETMQ], config.rocketmq_group
        )
    return watchers


def _save_watched(
    config: RunConfig,
    watchers: Mapping[tuple[str, str], VisibilityWatcher | RocketMQWatcher],
    result: WorkloadResult,
) -> None:
    """Save what each watcher saw under the run's folder, and note where in ``result``."""
    for (path, iso), watcher in watchers.items():
        result.visibility[(path, iso)] = watcher.save(Path(config.run_dir) / f"visible-{path}-{iso}.csv")
        if isinstance(watcher, RocketMQWatcher):
            result.received[path] = watcher.save_received(Path(config.run_dir) / f"received-{path}.avro")
            result.rocketmq_watcher = {
                "records": watcher.records,
                "undecodable": watcher.undecodable,
                "receive_errors": watcher.receive_errors,
                "ack_errors": watcher.ack_errors,
            }


def _crash_and_restart(coordinator: CoordinatorProcess) -> None:
    """The plan's coordinator kill. A restarted child that exits, or is slow to be assigned,
    is logged, not raised in this thread: the launcher supervises it and starts it again."""
    try:
        coordinator.crash_and_restart()
    except CoordinatorProcessError as exc:
        logger.warning("the restarted coordinator is not serving yet: %s", exc)


def _settle(
    config: RunConfig,
    paths: Sequence[str],
    watchers: Mapping[tuple[str, str], VisibilityWatcher | RocketMQWatcher],
    timeout: float,
    quiet_s: float,
) -> tuple[float, dict[str, int]]:
    """Wait until the checked paths' committed watchers have seen every committed order (or time
    out), then ``quiet_s`` more; return the time taken and what each checked path still misses."""
    started = time.monotonic()
    checked = [p for p in paths if p in CHECKED_PATHS]
    committed = {}
    for path in checked:
        store = config.store(path)
        committed[path] = {o.order_id for o in store.committed()}
        store.dispose()

    def missing() -> dict[str, int]:
        return {p: len(committed[p] - watchers[(p, "read_committed")].first_seen.keys()) for p in checked}

    # Native and plain publish synchronously: what is missing there is lost, not late.
    while any(missing().values()) and time.monotonic() - started < timeout:
        time.sleep(0.5)
    time.sleep(quiet_s)  # let the watchers drain the last fetches (and late duplicates come)
    left = missing()
    for path, count in left.items():
        if count:
            logger.warning("%s: %d committed orders not visible after %.0fs", path, count, timeout)
    return time.monotonic() - started, left
