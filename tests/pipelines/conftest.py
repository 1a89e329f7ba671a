"""Fixtures of the pipeline tests: the side-by-side run shared by its module, and the small
three-path demo shared by the session."""

from __future__ import annotations

import importlib.util
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

from cli.main import main
from servers import jars
from spark_pipelines.compare import PathMetrics, compare
from spark_pipelines.faults import FaultPlan
from spark_pipelines.paths import PATHS
from spark_pipelines.processes import coordinator_process
from spark_pipelines.runner import WorkloadResult, run_workload
from spark_pipelines.streaming import CustomerCounts
from spark_pipelines.watcher import load_visibility
from spark_pipelines.workload import RunConfig
from tests.soak import soak_only

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ORDERS = 240


def txbridge_available() -> bool:
    """The producer SDK and the coordinator are both in the tree."""
    import txbridge

    return (
        hasattr(txbridge, "TransactionProducer") and importlib.util.find_spec("coordinator.cli") is not None
    )


@dataclass
class SideBySide:
    config: RunConfig
    plan: FaultPlan
    paths: tuple[str, ...]
    workload: WorkloadResult
    metrics: list[PathMetrics]
    samples: dict[tuple[str, str], list[int]]
    stream_counts: dict[str, int] = field(default_factory=dict)
    stream_starts: int = 0

    def metric(self, path: str, isolation: str) -> PathMetrics:
        return next(m for m in self.metrics if (m.path, m.isolation) == (path, isolation))


# The PostgreSQL run is the same demo again with --db-url: make soak runs it, and make test keeps
# the SQLite one (the barrier's PostgreSQL cases are tests/producer's and tests/unit's). Both on
# the one worker that holds the SparkSession would be the suite's longest stretch longer still.
_POSTGRES_RUN = pytest.param(
    "postgresql",
    marks=soak_only("the demo on PostgreSQL again"),
)


@pytest.fixture(scope="module", params=["sqlite", _POSTGRES_RUN])
def side_by_side(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SideBySide]:
    """240 orders, every fault kind, through every available path; then the Spark comparison.

    Once with the default SQLite files, once with ``--db-url`` naming a PostgreSQL.
    """
    root = tmp_path_factory.mktemp("side-by-side")
    run_id = f"t{secrets.token_hex(4)}"
    db_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""
    config = RunConfig.create(run_id, kafka_bootstrap, root / run_id, check_after=1.0, db_url=db_url)
    plan = FaultPlan.generate(seed=11, orders=ORDERS, customers=12, every_fault=True)
    paths = PATHS if txbridge_available() else ("native", "plain")
    secret = secrets.token_hex(16)
    coordinator = coordinator_process(config, secret, check_delay=1.0) if "txbridge" in paths else None
    stream: CustomerCounts | None = None
    restarts: list[threading.Thread] = []
    try:
        if coordinator is not None:
            from spark_pipelines.runner import prepare

            prepare(config, paths)
            coordinator.start()
            stream = CustomerCounts(spark, kafka_bootstrap, config.topics["txbridge"], root / "stream")
            stream.start()
            coordinator.wait_ready()

        def on_order(path: str, index: int, _outcome: str) -> None:
            if stream is not None and path == "txbridge" and index == ORDERS // 3:
                thread = threading.Thread(target=stream.restart)
                thread.start()
                restarts.append(thread)

        workload = run_workload(
            config, plan, secret=secret, coordinator=coordinator, paths=paths, on_order=on_order
        )
        for thread in restarts:
            thread.join(120)
        counts: dict[str, int] = {}
        if stream is not None:
            stream.catch_up()
            counts = stream.counts()
        truth = {p: config.store(p).committed() for p in paths}
        visibility = {key: load_visibility(file) for key, file in workload.visibility.items()}
        metrics, samples = compare(
            spark, kafka_bootstrap, config.topics_for(paths), truth, visibility=visibility
        )
        yield SideBySide(
            config, plan, paths, workload, metrics, samples, counts, stream.starts if stream else 0
        )
    finally:
        if stream is not None:
            stream.stop()
        if coordinator is not None:
            coordinator.stop()


def db_file(config: RunConfig, path: str) -> Path:
    return Path(config.run_dir) / "db" / f"{path}.sqlite"


def demo_cache(tmp: Path) -> Path:
    """A temp cache whose ``jars`` are the real cache's: a demo's RocketMQ lives in it."""
    cache = tmp / "cache"
    cache.mkdir()
    jars.ensure_jars(jars.ROCKETMQ)
    (cache / "jars").symlink_to(jars.cache_root() / "jars", target_is_directory=True)
    return cache


def run_demo(cache: Path, out: Path, *args: str) -> tuple[Result, float]:
    """``txbridge demo --out OUT ARGS`` through the CLI with ``cache`` as its cache; and its seconds."""
    started = time.monotonic()
    result = CliRunner().invoke(
        main, ["demo", "--out", str(out), *args], env={"TXBRIDGE_CACHE": str(cache)}, catch_exceptions=False
    )
    return result, time.monotonic() - started


@dataclass(frozen=True)
class SmallDemo:
    result: Result
    out: Path  # the demo's --out: one run folder in it
    cache: Path
    seconds: float


#: The small demo's orders: RocketMQ left out, so no RocketMQ starts; the Spark sinks' comparison
#: at its default size.
SMALL_DEMO_ORDERS = 8


@pytest.fixture(scope="session")
def small_demo(
    kafka_bootstrap: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> SmallDemo:
    """One ``txbridge demo --paths txbridge,native,plain`` with the Spark sinks' comparison, no
    streaming, no coordinator kill.

    Shared by the test of leaving RocketMQ out (tests/pipelines/test_rocketmq_path.py) and the
    sinks' comparison (tests/pipelines/test_spark_sink_comparison.py): each demo run costs the
    Spark worker a minute or more in ``make test``, and neither test needs a run of its own.
    """
    tmp = tmp_path_factory.mktemp("small-demo")
    cache = demo_cache(tmp)
    args = ["--orders", str(SMALL_DEMO_ORDERS), "--customers", "3", "--paths", "txbridge,native,plain"]
    args += ["--no-streaming", "--no-coordinator-kill"]
    result, seconds = run_demo(cache, tmp / "reports", "--bootstrap", kafka_bootstrap, *args)
    return SmallDemo(result, tmp / "reports", cache, seconds)
