"""Fixtures of the Spark sink's tests: a namespace with a coordinator, the driver's check service,
and a plain read_committed reader of what was published."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from coordinator.config import CoordinatorConfig, Secrets
from coordinator.service import Coordinator
from tests.kafka_helpers import delete_namespaces
from txbridge.spark import SinkChecks
from txbridge.topics import init_topics
from txbridge.wire import Topics

SECRET = "spark-sink-secret"  # noqa: S105 - a test-only HMAC secret
GROUP = "spark-sink"
PARTITIONS = 3


@dataclass
class SinkEnv:
    bootstrap: str
    namespace: str
    checks: SinkChecks

    @property
    def topics(self) -> Topics:
        return Topics(self.namespace)

    def options(self, **more: str) -> dict[str, str]:
        return {**self.checks.options(), "secret": SECRET, **more}


@contextmanager
def sink_namespace(
    bootstrap: str,
    prefix: str,
    partitions: int = PARTITIONS,
    checks: dict[str, Any] | None = None,
    **config: Any,
) -> Iterator[tuple[str, Coordinator, SinkChecks]]:
    """A new namespace, its coordinator (in a thread) and the driver's :class:`SinkChecks`; the
    coordinator's settings are the sink tests' quick ones, overridden by ``config``."""
    namespace = f"{prefix}{uuid.uuid4().hex[:8]}"
    init_topics(bootstrap, namespace, partitions)
    settings: dict[str, Any] = {
        "check_delay_s": 1.0,
        "check_backoff_s": 0.5,
        "check_backoff_max_s": 1.0,
        "max_checks": 60,
        "check_timeout_s": 2.0,
        "producer_liveness_s": 30.0,
        **config,
    }
    service = Coordinator(
        CoordinatorConfig(
            bootstrap=bootstrap,
            namespace=namespace,
            group_id=f"coord-{namespace}",
            secrets=Secrets(default=SECRET),
            **settings,
        )
    )
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    assert service.running.wait(60), "the coordinator got no partitions within 60s"
    sink_checks = SinkChecks(bootstrap, GROUP, secret=SECRET, namespace=namespace, **(checks or {})).start()
    try:
        yield namespace, service, sink_checks
    finally:
        sink_checks.stop()
        service.stop()
        thread.join(60)
        delete_namespaces(bootstrap, [namespace])


@pytest.fixture(scope="module")
def sink_env(kafka_bootstrap: str) -> Iterator[SinkEnv]:
    """A namespace, a coordinator (in a thread) and the driver's :class:`SinkChecks`."""
    with sink_namespace(kafka_bootstrap, "txbs") as (namespace, _service, checks):
        yield SinkEnv(kafka_bootstrap, namespace, checks)


def read_topic(
    bootstrap: str, topic: str, *, at_least: int, settle_s: float = 3.0, timeout: float = 90.0
) -> list:
    """Every committed record of ``topic``: read until ``at_least`` came and nothing more for ``settle_s``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    records = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                records.append(msg)
                last = time.monotonic()
            elif len(records) >= at_least and time.monotonic() - last > settle_s:
                break
    finally:
        consumer.close()
    return records
