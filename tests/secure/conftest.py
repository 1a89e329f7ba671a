"""The secured, replicated cluster of the ``cluster`` tests: started once per session.

Three KRaft nodes of :class:`servers.cluster.LocalCluster` on free ports in a
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator
from servers.cluster import LocalCluster
from txbridge import kafka as txkafka
from txbridge.acls import Acl

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
    return [(msg.key(), msg.value()) for msg in read_messages(kafka, topic, timeout=timeout)]


def read_messages(kafka: SecureKafka, topic: str, *, timeout: float = 30.0) -> list[Any]:
    """Every record (confluent-kafka messages) a read_committed consumer sees on ``topic``,
    read to each partition's end."""
    consumer = txkafka.consumer(
        kafka.bootstrap, f"reader-{uuid.uuid4().hex[:8]}", kafka.config, enable_partition_eof=True
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        seen: list[Any] = []
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
                    seen.append(msg)
        return seen
    finally:
        consumer.close()


def _granted(kafka: SecureKafka, principal: str) -> set[tuple[str, str, bool, str]]:
    """The ACLs the cluster lists for ``principal``, as ``(resource, name, prefixed, operation)``."""
    admin = txkafka.admin(kafka.bootstrap, kafka.config)
    everything = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY,
        AclPermissionType.ANY,
    )  # fmt: skip
    found = admin.describe_acls(everything, request_timeout=30).result(timeout=30)
    return {
        (
            b.restype.name.lower().replace("_", "-"),
            b.name,
            b.resource_pattern_type == ResourcePatternType.PREFIXED,
            b.operation.name.capitalize(),
        )
        for b in found
    }


def wait_granted(kafka: SecureKafka, acls: Iterable[Acl]) -> None:
    """ACLs reach the brokers through the metadata log: wait until they are listed."""
    acls = list(acls)
    for principal in {a.principal for a in acls}:
        want = {(a.resource, a.name, a.prefixed, a.operation) for a in acls if a.principal == principal}
        deadline = time.monotonic() + 30
        while not want <= _granted(kafka, principal):
            assert time.monotonic() < deadline, f"the ACLs of {principal} were not listed within 30s"
            time.sleep(0.2)


def wait_readable(
    kafka: SecureKafka, config: Mapping[str, str], topics: list[str], timeout: float = 30.0
) -> None:
    """Until every partition leader lets the user of ``config`` fetch ``topics``: the ACL listing
    comes from one broker, and each broker applies the metadata log at its own pace (a CI run once
    saw the coordinator's first fetch of ``<ns>_producers`` refused by the broker that lagged)."""
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    consumer = txkafka.consumer(kafka.bootstrap, probe, {**config, "log_level": 0}, enable_partition_eof=True)
    try:
        metadata = consumer.list_topics(timeout=30).topics
        pending = {(name, p) for name in topics for p in metadata[name].partitions}
        consumer.assign([TopicPartition(name, p, txkafka.FROM_START) for name, p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending:  # a refused fetch is retried by the client until the broker allows it
            user = config.get("sasl.username")
            assert time.monotonic() < deadline, f"{user} still may not read {sorted(pending)}"
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
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
