"""Run the workload on every path at once: topics, watchers, producer processes, settling."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.process import CoordinatorProcess
from spark_pipelines.faults import FaultPlan
from spark_pipelines.paths import PATHS
from spark_pipelines.processes import PathResult, ProducerRunner
from spark_pipelines.watcher import VisibilityWatcher
from spark_pipelines.workload import RunConfig
from txbridge import _kafka

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
    settled: bool = True
    coordinator_kills: int = 0
    #: (SIGKILL, ready again) wall times of each coordinator restart
    coordinator_outages: list[tuple[float, float]] = field(default_factory=list)


def prepare(config: RunConfig, paths: Sequence[str] = PATHS, *, client: ClientConfig | None = None) -> None:
    """Create the run's folders, topics and tables (idempotent); ``client``: the cluster's settings."""
    run_dir = Path(config.run_dir)
    (run_dir / "db").mkdir(parents=True, exist_ok=True)
    specs = [_kafka.TopicSpec(config.topics[p], config.partitions) for p in paths]
    _kafka.ensure_topics(config.bootstrap, specs, extra=client.librdkafka() if client is not None else None)
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
    on_order: Callable[[str, int, str], None] | None = None,
    client: ClientConfig | None = None,
) -> WorkloadResult:
    """Run ``plan`` through ``paths`` concurrently, one producer process chain per path.

    The coordinator (txbridge) is killed and restarted after order
    ``plan.coordinator_kill_after``. After the last order the run waits up to
    ``settle_timeout`` seconds for txbridge's back-checks to publish every
    committed order, then stops the producers and watchers.

    ``client`` holds the cluster's client settings: every producer process, watcher and
    topic creation uses them.

    Raises:
        PipelineError: a producer process failed outside the plan.
    """
    prepare(config, paths, client=client)
    config.plan_file.write_text(plan.to_json())
    settings = client.librdkafka() if client is not None else None
    watchers = {
        (p, iso): VisibilityWatcher(config.bootstrap, config.topics[p], iso, settings)
        for p in paths
        for iso in ISOLATIONS
    }
    for watcher in watchers.values():
        watcher.start()
    restarts: list[threading.Thread] = []

    def observe(path: str, index: int, outcome: str) -> None:
        if path == "txbridge" and coordinator is not None and index == plan.coordinator_kill_after:
            thread = threading.Thread(target=coordinator.crash_and_restart, name="coordinator-restart")
            thread.start()
            restarts.append(thread)
        if on_order:
            on_order(path, index, outcome)

    runners = {
        p: ProducerRunner(config, p, plan, secret=secret, on_order=observe, client=client) for p in paths
    }
    result = WorkloadResult()
    try:
        with ThreadPoolExecutor(len(runners)) as pool:
            futures = {p: pool.submit(r.run) for p, r in runners.items()}
            result.paths = {p: f.result() for p, f in futures.items()}
        for thread in restarts:
            thread.join(60)
        result.settle_s, result.settled = _settle(config, paths, watchers, settle_timeout)
        for runner in runners.values():
            runner.finish()
    finally:
        for runner in runners.values():
            runner.kill()
        for watcher in watchers.values():
            watcher.stop()
    for (path, iso), watcher in watchers.items():
        result.visibility[(path, iso)] = watcher.save(Path(config.run_dir) / f"visible-{path}-{iso}.csv")
    result.coordinator_kills = coordinator.kills if coordinator else 0
    result.coordinator_outages = list(coordinator.outages) if coordinator else []
    return result


def _settle(
    config: RunConfig,
    paths: Sequence[str],
    watchers: dict[tuple[str, str], VisibilityWatcher],
    timeout: float,
) -> tuple[float, bool]:
    """Wait until each path's read_committed watcher has seen every committed order (or time out)."""
    started = time.monotonic()
    committed = {}
    for path in paths:
        store = config.store(path)
        committed[path] = {o.order_id for o in store.committed()}
        store.dispose()
    while True:
        missing = {p: len(committed[p] - watchers[(p, "read_committed")].first_seen.keys()) for p in paths}
        # Native and plain publish synchronously: what is missing there is lost, not late.
        if missing.get("txbridge", 0) == 0 or time.monotonic() - started > timeout:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # let the watchers drain the last fetches
    settled = missing.get("txbridge", 0) == 0
    if not settled:
        logger.warning("txbridge: %d committed orders not visible after %.0fs", missing["txbridge"], timeout)
    return time.monotonic() - started, settled
