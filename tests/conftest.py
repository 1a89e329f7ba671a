"""Shared fixtures: one Kafka and one SparkSession per test session.

Kafka comes from, in order:

1. ``KAFKA_BOOTSTRAP_SERVERS``: an existing cluster (it must allow transactions);
2. a testcontainers Kafka, when a Docker engine answers (``TXBRIDGE_TEST_DOCKER=0`` skips it);
3. the local broker of :mod:`servers.broker`, on free ports in a temp folder.

PostgreSQL (``postgres_url``) comes from ``TXBRIDGE_TEST_POSTGRES_URL`` (a SQLAlchemy URL of
a database the tests may create and drop tables in), else from the ``pgserver`` package:
PostgreSQL binaries from PyPI, started in a temp folder, no Docker.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from servers.broker import LocalKafka, free_port
from tests.kafka_helpers import delete_namespaces
from txbridge import kafka
from txbridge.topics import init_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# Test-seconds per xdist worker and group at the end of a run (the time budget: docs/testing.md).
pytest_plugins = ["tests.worker_time"]


_stopped_by: list[int] = []  # the signal that cut the run, once one has


def pytest_configure(config: pytest.Config) -> None:
    """A run cut by a timeout (SIGTERM from CI or a shell's ``timeout``) still tears its session
    down, so the brokers, clusters and servers it started stop with it: pytest runs the
    fixtures' finalizers on KeyboardInterrupt, and dies without them on SIGTERM."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, functools.partial(_interrupted, config))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _stopped_by and hasattr(config, "workerinput"):
        # An xdist worker whose finalizers ran: exit now rather than wait on a controller
        # that is only waiting for it (see _interrupted).
        os._exit(128 + _stopped_by[0])


def _interrupted(config: pytest.Config, signum: int, _frame: object) -> None:
    _stopped_by.append(signum)
    if config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput"):
        _stop_workers(signum)
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _stop_workers(signum: int) -> None:
    """The xdist controller: the servers belong to the workers, and the controller's own
    shutdown kills them within seconds, before their finalizers end. So each worker gets the
    signal (and tears its session down as above), the controller waits for them, and exits."""
    import psutil

    workers = psutil.Process().children()
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.send_signal(signum)
    psutil.wait_procs(workers, timeout=180)
    os._exit(128 + signum)


# `make test` runs the suite on pytest-xdist workers with `--dist loadgroup`. A session server
# (the secured 3-node cluster, the SparkSession, the Spark cluster, RocketMQ) costs a JVM or
# three and tens of seconds to start, so every test that uses one goes to the one worker that
# starts it: tests are grouped by the costliest server they use, else by module (a module's
# fixtures then start once too). These groups are also the suite's longest stretches, so a
# worker puts them first: they start at once on separate workers while the short modules fill
# in around them.
_SERVER_GROUPS = {"secure_kafka": "secured-cluster", "spark": "spark", "spark_cluster": "spark"}
# Modules that start a 3-node cluster of their own: beside the session's, that would be six
# brokers on two cores, and the node-kill step's figures would measure the crowd.
_CLUSTER_MODULES = {"tests/integration/test_bench_node_kill.py"}


def _group(item: pytest.Item) -> str:
    fixtures = getattr(item, "fixturenames", ())
    for fixture, group in _SERVER_GROUPS.items():
        if fixture in fixtures:
            return group
    module = item.nodeid.split("::", 1)[0]
    if module in _CLUSTER_MODULES:
        return "secured-cluster"
    if module.startswith("tests/rocketmq/"):
        return "rocketmq"  # the session's RocketMQ (tests/rocketmq/conftest.py); no Spark there
    if module.startswith("tests/spark_sink/"):
        return "spark"  # its module-scoped coordinator and SinkChecks start once, on one worker
    return module


# tryfirst: xdist's worker reads the xdist_group marks in its own pytest_collection_modifyitems
# (it appends "@group" to each nodeid, which is what loadgroup schedules by), and pluggy would
# otherwise call it before this conftest's hook, when no test has a mark yet: every test would
# then be its own group and each worker would start its own copy of every session server.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts the same way
        servers = {*_SERVER_GROUPS.values(), "secured-cluster", "rocketmq"}
        items.sort(key=lambda item: groups[item.nodeid] not in servers)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run ungrouped: each worker would start its own secured cluster, Spark cluster and
    RocketMQ, and the module fixtures of a module split across workers would run on each."""
    config = session.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")) or not session.items:
        return
    if not any("@" in item.nodeid for item in session.items):
        raise pytest.UsageError(
            f"--dist loadgroup groups nothing with pytest {pytest.__version__}: pytest-xdist did not "
            "mark the tests' nodeids with their xdist_group. Install what pyproject.toml's test extra "
            "pins (make test does), or run with TEST_WORKERS=0."
        )


def _docker_answers() -> bool:
    if os.environ.get("TXBRIDGE_TEST_DOCKER", "1") == "0":
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of the session's Kafka."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        kafka.check_reachable(external, timeout=15)
        yield external
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        image = os.environ.get("TXBRIDGE_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.9.0")
        with KafkaContainer(image).with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLAlchemy URL of the session's PostgreSQL."""
    external = os.environ.get("TXBRIDGE_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    try:
        import pgserver
    except ImportError:
        pytest.fail(
            "the PostgreSQL tests need the pgserver package (pip install -e '.[test]') "
            "or TXBRIDGE_TEST_POSTGRES_URL naming a database"
        )
    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    try:
        yield server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.cleanup()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def topic_factory(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Callable[..., str]:
    """Create a uuid-named topic: ``topic_factory(partitions=1, config=None, prefix="t")``."""

    def make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = unique_name(prefix)
        kafka.ensure_topics(kafka_bootstrap, [kafka.TopicSpec(name, partitions, config or {})])
        return name

    return make


@pytest.fixture
def namespace_factory(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Create a txbridge namespace's internal topics: ``namespace_factory(partitions=3, prefix="txbns")``.

    Returns the uuid-named namespace; every namespace made is deleted at teardown, in one admin
    request (fixtures that use this one end first: their coordinators stop before the topics go).
    """
    made: list[str] = []

    def make(partitions: int = 3, prefix: str = "txbns") -> str:
        namespace = f"{prefix}{uuid.uuid4().hex[:10]}"
        init_topics(kafka_bootstrap, namespace, partitions)
        made.append(namespace)
        return namespace

    yield make
    delete_namespaces(kafka_bootstrap, made)


@pytest.fixture
def group_factory(unique_name: Callable[[str], str]) -> Callable[[], str]:
    """A fresh uuid-named consumer group id per call."""
    return lambda: unique_name("g")


#: ``0``: the session's SparkSession gets no Kafka source jars, for a pyspark whose jars Maven
#: Central does not serve (make matrix sets it); the tests that read Kafka from Spark skip.
SPARK_KAFKA_SOURCE_ENV = "TXBRIDGE_TEST_SPARK_KAFKA_SOURCE"


def spark_has_kafka_source() -> bool:
    return os.environ.get(SPARK_KAFKA_SOURCE_ENV, "1") != "0"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session's one SparkSession, with the Kafka source and Avro jars."""
    from spark_pipelines.session import build_session

    session = build_session("txbridge-tests", kafka_source=spark_has_kafka_source())
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def spark_kafka_source() -> None:
    """For a test that reads Kafka through Spark's Kafka source: skips it without those jars."""
    if not spark_has_kafka_source():
        pytest.skip(f"{SPARK_KAFKA_SOURCE_ENV}=0: this pyspark's Kafka source jars are not served")
