"""The Spark standalone cluster of the ``spark_cluster`` tests: started once per session.

A master and two workers (:class:`servers.spark_cluster.LocalSparkCluster`, run by
pyspark's own ``bin/spark-class``) on 127.0.0.1 and free ports, in ``<cache>/spark-cluster``
of a temp folder, so ``txbridge spark status`` with ``TXBRIDGE_CACHE=<cache>`` finds it.
Each worker offers 1 core and 1 GiB, the size of one executor with Spark's default
``spark.executor.memory``: a job gets two executors, one per worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servers.spark_cluster import LocalSparkCluster

logger = logging.getLogger(__name__)

# About 20 s on an idle 2-core machine; minutes on a loaded one.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SessionSparkCluster:
    cluster: LocalSparkCluster
    #: the folder to pass as TXBRIDGE_CACHE for the CLI to find the cluster.
    cache: Path
    start_s: float


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionSparkCluster]:
    cache = tmp_path_factory.mktemp("cache")
    cluster = LocalSparkCluster.on_free_ports(cache / "spark-cluster", workers=2)
    started = time.monotonic()
    status = cluster.start(timeout=START_TIMEOUT_S)
    elapsed = time.monotonic() - started
    logger.info(
        "Spark cluster up at %s in %.1fs; RSS %s",
        status.master_url,
        elapsed,
        {name: f"{rss / 2**20:.0f} MiB" for name, rss in status.rss_bytes.items()},
    )
    try:
        yield SessionSparkCluster(cluster, cache, elapsed)
    finally:
        cluster.stop()
