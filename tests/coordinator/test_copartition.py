"""A coordinator refuses to start on a namespace whose half, op and state topics are not
co-partitioned, and says which topics differ and what to do."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.coordinator.conftest import SECRET, Env
from tests.kafka_helpers import delete_namespaces
from txbridge import kafka
from txbridge.errors import ConfigurationError
from txbridge.kafka import TopicSpec
from txbridge.topics import init_topics
from txbridge.wire import Topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def skewed_namespace(kafka_bootstrap: str) -> Iterator[str]:
    """A namespace whose op topic has 4 partitions and the rest 3 (``txbridge init`` accepts an
    existing topic with more partitions than asked)."""
    namespace = f"txbcp{uuid.uuid4().hex[:10]}"
    kafka.ensure_topics(kafka_bootstrap, [TopicSpec(Topics(namespace).op, 4)])
    init_topics(kafka_bootstrap, namespace, 3)
    yield namespace
    delete_namespaces(kafka_bootstrap, [namespace])


def test_the_coordinator_refuses_to_start_and_names_the_topics(env: Env, skewed_namespace: str) -> None:
    topics = Topics(skewed_namespace)
    handle = env.start(wait=False, namespace=skewed_namespace, group_id=f"coord-{skewed_namespace}")
    handle.thread.join(30)
    assert not handle.thread.is_alive(), "the coordinator started on topics that are not co-partitioned"
    assert [type(e) for e in handle.errors] == [ConfigurationError], handle.errors
    message = str(handle.errors[0])
    assert f"{topics.half} has 3, {topics.op} has 4, {topics.state} has 3 partitions" in message
    assert "kafka-topics --alter --partitions 4" in message
    assert not handle.service.running.is_set()
    handle.errors.clear()  # expected: the fixture's teardown would raise it again


def test_txbridge_coordinator_exits_non_zero_with_the_message(env: Env, skewed_namespace: str) -> None:
    args = [
        sys.executable,
        "-m",
        "coordinator",
        "--bootstrap",
        env.bootstrap,
        "--namespace",
        skewed_namespace,
    ]
    done = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "TXBRIDGE_DEFAULT_SECRET": SECRET},
        check=False,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"{Topics(skewed_namespace).op} has 4" in done.stdout + done.stderr
    assert "not co-partitioned" in done.stdout + done.stderr
