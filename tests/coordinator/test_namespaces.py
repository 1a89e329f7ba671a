"""Coordinators of two namespaces on one host, each with its default group and the host's name."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import httpx
import pytest

from servers.broker import free_port
from tests.coordinator.conftest import PARTITIONS, Env, RunningCoordinator, eventually
from tests.coordinator.wire_producer import Msg, WireProducer
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

COUNT = 5


def _second_namespace(env: Env, namespace_factory: Callable[..., str]) -> tuple[str, WireProducer]:
    namespace = namespace_factory(PARTITIONS, prefix="txbt")
    return namespace, WireProducer(env.bootstrap, namespace, PARTITIONS)


def _start(env: Env, namespace: str, instance_id: str) -> RunningCoordinator:
    """A coordinator of ``namespace`` whose group is left to its default."""
    handle = env.start(namespace=namespace, group_id=None, instance_id=instance_id)
    assert handle.service.config.group_id == f"txbridge-coordinator.{namespace}"
    return handle


def _commit(producer: WireProducer, topic: str) -> set[str]:
    """``COUNT`` committed one-message transactions to ``topic``; their tx ids."""
    return {
        producer.transaction([Msg(topic, f"m{i}".encode(), key=f"k{i}".encode())], TxState.COMMIT)
        for i in range(COUNT)
    }


def _published_once(env: Env, topic: str, tx_ids: set[str]) -> None:
    """A read_committed consumer of ``topic`` sees each of ``tx_ids``' messages exactly once."""
    assert len(wait_for(env.bootstrap, topic, COUNT)) >= COUNT, f"{topic}: the coordinator published nothing"
    seen = read_topic(env.bootstrap, topic)
    assert sorted(s.headers["txb.tx"].decode() for s in seen) == sorted(tx_ids)
    assert sorted(s.value for s in seen) == sorted(f"m{i}".encode() for i in range(COUNT))


def test_one_after_the_other_under_one_instance_id(
    env: Env, topic_factory: Callable[..., str], namespace_factory: Callable[..., str]
) -> None:
    other, other_producer = _second_namespace(env, namespace_factory)
    first_topic, other_topic = topic_factory(partitions=2), topic_factory(partitions=2)
    instance = f"host-{uuid.uuid4().hex[:6]}"

    first = _start(env, env.namespace, instance)
    first_txs = _commit(env.producer, first_topic)
    _published_once(env, first_topic, first_txs)
    first.stop()  # a static member: it stays in its group until its session times out

    second = _start(env, other, instance)
    other_txs = _commit(other_producer, other_topic)
    _published_once(env, other_topic, other_txs)
    second.stop()

    _published_once(env, first_topic, first_txs)


def test_side_by_side_under_one_instance_id(
    env: Env, topic_factory: Callable[..., str], namespace_factory: Callable[..., str]
) -> None:
    other, other_producer = _second_namespace(env, namespace_factory)
    first_topic, other_topic = topic_factory(partitions=2), topic_factory(partitions=2)
    instance = f"host-{uuid.uuid4().hex[:6]}"

    first = _start(env, env.namespace, instance)
    second = _start(env, other, instance)
    first_txs = _commit(env.producer, first_topic)
    other_txs = _commit(other_producer, other_topic)

    _published_once(env, first_topic, first_txs)
    _published_once(env, other_topic, other_txs)
    first.stop()  # re-raises what ended either of them early (fenced, say)
    second.stop()
    _published_once(env, first_topic, first_txs)
    _published_once(env, other_topic, other_txs)


def test_a_coordinator_that_owns_nothing_of_an_unserved_namespace_says_so(
    env: Env, namespace_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Two namespaces forced into one group under one instance id (the misconfiguration the
    namespace-scoped default group prevents): the second coordinator takes over the first's
    static membership and its assignment, owns nothing of its own namespace, and says so: a
    WARNING that names the unserved partitions and what to set, the gauge, and /readyz 503.
    The first namespace's coordinator, serving, is live and ready."""
    caplog.set_level(logging.WARNING, logger="coordinator.group.health")
    other, _producer = _second_namespace(env, namespace_factory)
    group, instance = f"shared-{uuid.uuid4().hex[:6]}", f"host-{uuid.uuid4().hex[:6]}"
    first_port, second_port = free_port(), free_port()
    first = env.start(group_id=group, instance_id=instance, metrics_port=first_port)
    probes = f"http://127.0.0.1:{first_port}"
    assert httpx.get(f"{probes}/healthz", timeout=5).status_code == 200
    assert eventually(lambda: httpx.get(f"{probes}/readyz", timeout=5).status_code == 200)
    first.stop()

    second = env.start(namespace=other, group_id=group, instance_id=instance, metrics_port=second_port)
    assert second.service.partitions == {}

    def not_ready() -> httpx.Response | None:
        answer = httpx.get(f"http://127.0.0.1:{second_port}/readyz", timeout=5)
        return answer if answer.status_code == 503 and "unserved" in answer.text else None

    answer = eventually(not_ready, timeout=40)
    assert answer is not None
    assert f"owns no partitions while partitions {list(range(PARTITIONS))}" in caplog.text
    assert "--group-id" in caplog.text
    metrics = httpx.get(f"http://127.0.0.1:{second_port}/metrics", timeout=5).text
    assert f"txbridge_coordinator_unserved_partitions {float(PARTITIONS)}" in metrics
    assert "txbridge_coordinator_ready 0.0" in metrics
    assert httpx.get(f"http://127.0.0.1:{second_port}/healthz", timeout=5).status_code == 200
