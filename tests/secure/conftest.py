"""The secured, replicated cluster of the ``cluster`` tests: started once per session.

Three KRaft nodes of :class:`txbridge.tools.local.cluster.LocalCluster` on free ports in a
temp folder: SASL_SSL with SCRAM-SHA-512, mutual TLS between the nodes,
``StandardAuthorizer`` with nothing allowed without an ACL, replication factor 3 and
``min.insync.replicas`` 2. The fixture yields the bootstrap list, the admin's librdkafka
settings and the admin's Java client properties file.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator
from txbridge import kafka as txkafka
from txbridge.tools.local.cluster import LocalCluster

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SecureKafka:
    """The session's secured cluster, as a client sees it."""

    cluster: LocalCluster
    #: the folder to pass as TXBRIDGE_CACHE for the CLI to find the cluster.
    cache: Path
    bootstrap: str
    #: librdkafka settings of the admin user (a super user): pass as ``extra_config``.
    config: dict[str, str]
    #: the admin's Java client properties (``--command-config``).
    properties_file: Path
    start_s: float


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    # <cache>/kafka-cluster: where 'txbridge kafka ...' looks when TXBRIDGE_CACHE=<cache>.
    cache = tmp_path_factory.mktemp("cache")
    cluster = LocalCluster(cache / "kafka-cluster")
    started = time.monotonic()
    status = cluster.start()
    elapsed = time.monotonic() - started
    logger.info("secured cluster up at %s in %.1fs", status.bootstrap, elapsed)
    try:
        yield SecureKafka(
            cluster, cache, status.bootstrap, cluster.client_config(), status.properties_file, elapsed
        )
    finally:
        cluster.stop()


@pytest.fixture
def secure_topic(secure_kafka: SecureKafka) -> Callable[..., str]:
    """Create a uuid-named topic as the admin: ``secure_topic(partitions=1)`` (replication factor 3)."""

    def make(partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        spec = txkafka.TopicSpec(name, partitions, replication_factor=3)
        txkafka.ensure_topics(secure_kafka.bootstrap, [spec], extra=secure_kafka.config)
        return name

    return make


def read_committed(
    kafka: SecureKafka, topic: str, *, timeout: float = 30.0
) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) a read_committed consumer sees on ``topic``, read to each partition's end."""
    consumer = txkafka.consumer(
        kafka.bootstrap, f"reader-{uuid.uuid4().hex[:8]}", kafka.config, enable_partition_eof=True
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        seen: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} did not reach their end")
            for msg in consumer.consume(500, 0.5):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                elif err is not None:
                    raise RuntimeError(str(err))
                else:
                    seen.append((msg.key(), msg.value()))
        return seen
    finally:
        consumer.close()


@contextmanager
def running_coordinator(config: CoordinatorConfig) -> Iterator[Coordinator]:
    """A coordinator in a thread, once it has partitions; stopped (and its error re-raised) on exit."""
    service = Coordinator(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="secure-coordinator", daemon=True)
    thread.start()
    try:
        ready = service.running.wait(90)
        if errors:
            raise errors[0]
        assert ready, "the coordinator got no partitions within 90s"
        yield service
    finally:
        service.stop()
        thread.join(60)
    if errors:
        raise errors[0]
