"""The Spark sink on the Spark standalone cluster (issue 29): an executor SIGKILLed mid-write.

The driver (``tests/spark_sink/driver_job.py retry --master spark://...``) runs in its own
process; its tasks run in the session cluster's two executors, JVMs the workers started, each
with its Python workers. The task of partition 0, on its first attempt, writes part of its rows
(two transactions, journaled and left undecided), records its Python worker's pid and waits:
the test SIGKILLs that executor, its JVM and its Python processes. Spark runs the task again on
an executor; the driver rolls the dead attempt's transactions back and commits the retry's. A
read_committed consumer sees every row once, each key's in order.

The driver's ``SinkChecks`` listens on every interface (``check_host="0.0.0.0"``) at a chosen
port and registers ``advertised_url`` with this host's network address, and the coordinator
allows back-checks to that host only (``allowed_check_hosts``): the set-up of a driver whose
coordinators run on other hosts. The batch's transactions wait for the driver's decision past
the coordinator's check delay, so they are back-checked through that URL.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from coordinator.config import CoordinatorConfig, Secrets
from servers.broker import free_port
from tests.cluster.conftest import SessionSparkCluster
from tests.secure.conftest import running_coordinator
from tests.spark_sink.conftest import read_topic
from tests.spark_sink.drivers import assert_once_in_order, finish_driver, start_driver, wait_for_file
from txbridge.topics import init_topics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.spark_cluster,
    pytest.mark.timeout(1200),
]

SECRET = "spark-sink-cluster-secret"  # noqa: S105 - a test-only HMAC secret
GROUP = "spark-sink"
ROWS = 120  # 15 per key: partition 0 holds at least one key, more than the 12 written before the kill
KEYS = 8
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _network_address() -> str:
    """This host's first non-loopback IPv4 address (``localhost`` if it has none): what a
    coordinator on another host would use to reach the driver."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return "localhost"


def _kill_executor_of(pid: int) -> None:
    """SIGKILL the executor JVM whose Python worker is ``pid``, and every process under it."""
    jvm = next(
        (p for p in psutil.Process(pid).parents() if EXECUTOR_CLASS in " ".join(p.cmdline())),
        None,
    )
    assert jvm is not None, f"process {pid} is not under an executor JVM"
    doomed = [jvm, *jvm.children(recursive=True)]
    for process in doomed:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(doomed, timeout=30)


def test_an_executor_killed_mid_write_loses_and_doubles_nothing(
    spark_cluster: SessionSparkCluster,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    namespace = f"txbsc{uuid.uuid4().hex[:8]}"
    init_topics(kafka_bootstrap, namespace, 3)
    out = topic_factory(2)
    host, port = _network_address(), free_port()
    config = CoordinatorConfig(
        bootstrap=kafka_bootstrap,
        namespace=namespace,
        group_id=f"coord-{namespace}",
        check_delay_s=1.0,
        check_backoff_s=0.5,
        check_backoff_max_s=2.0,
        max_checks=600,  # the batch's transactions are asked about (UNKNOWN) until it is decided
        check_timeout_s=2.0,
        producer_liveness_s=30.0,
        allowed_check_hosts=(host,),
        secrets=Secrets(default=SECRET),
    )
    hang_file = tmp_path / "hanging"

    with running_coordinator(config) as service:
        driver = start_driver(
            "retry",
            *("--master", spark_cluster.cluster.master_url, "--out", out, "--rows", str(ROWS)),
            *("--sink-id", f"cluster-{uuid.uuid4().hex[:8]}", "--hang-file", str(hang_file)),
            *("--check-host", "0.0.0.0", "--check-port", str(port)),
            *("--advertised-url", f"http://{host}:{port}", "--linger", "5"),
            bootstrap=kafka_bootstrap,
            namespace=namespace,
            group=GROUP,
            secret=SECRET,
        )
        worker_pid = int(wait_for_file(hang_file, driver, "the task's hang", timeout=600))
        _kill_executor_of(worker_pid)
        output = finish_driver(driver, timeout=600)
        published = read_topic(kafka_bootstrap, out, at_least=ROWS, settle_s=5.0)
        stats = dict(service.stats)

    assert "QUERY DONE" in output
    assert "Lost executor" in output, output[-5000:]
    assert_once_in_order(
        ((r.topic(), r.key(), r.value()) for r in published), {f"k{i % KEYS}-{i}" for i in range(ROWS)}
    )
    # Back-checks went to the advertised URL and reached the driver's SinkChecks.
    assert stats.get("check_requests", 0) > 0, stats
    assert (stats.get("checks_refused", 0), stats.get("checks_not_asked", 0)) == (0, 0), stats
