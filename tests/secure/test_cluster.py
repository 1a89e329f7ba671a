"""The secured, replicated local cluster as its clients see it.

Refused without TLS, a trusted CA and the right SCRAM password; replication factor 3
and min ISR 2 everywhere; the txbridge transaction path over SASL_SSL; one node
SIGKILLed and brought back. The node kill runs last: the cluster is the session's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource

from coordinator.config import CoordinatorConfig, Secrets
from servers.cluster import LocalCluster
from tests.kafka_helpers import delete_namespaces
from tests.secure.conftest import SecureKafka, read_committed, running_coordinator
from txbridge import Message, TransactionProducer, TxState, kafka
from txbridge.errors import BrokerError
from txbridge.topics import internal_topics

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SECRET = "secure-test-secret"  # noqa: S105 - a test-only HMAC secret


def _errors_seen(secure: SecureKafka, settings: dict[str, Any]) -> tuple[KafkaException, list[KafkaError]]:
    """What a client with ``settings`` is told: the exception of its first request and its error events."""
    events: list[KafkaError] = []
    client = kafka.producer(secure.bootstrap, {**settings, "error_cb": events.append, "log_level": 0})
    with pytest.raises(KafkaException) as refused:
        client.list_topics(timeout=3)
    client.poll(1.0)  # serves the error events
    return refused.value, events


# ------------------------------------------------------------------ (a) who is refused


def test_a_plaintext_client_is_refused(secure_kafka: SecureKafka) -> None:
    refused, events = _errors_seen(secure_kafka, {})

    assert refused.args[0].code() == KafkaError._TRANSPORT
    assert events


def test_a_client_that_does_not_trust_the_ca_is_refused(secure_kafka: SecureKafka) -> None:
    settings = {k: v for k, v in secure_kafka.config.items() if k != "ssl.ca.location"}

    _, events = _errors_seen(secure_kafka, settings)

    failures = [e for e in events if e.code() == KafkaError._SSL]
    assert failures
    assert "certificate verify failed" in failures[0].str()


@pytest.mark.parametrize("override", [{"sasl.password": "not-the-password"}, {"sasl.username": "mallory"}])
def test_a_wrong_password_or_user_is_refused(secure_kafka: SecureKafka, override: dict[str, str]) -> None:
    refused, events = _errors_seen(secure_kafka, {**secure_kafka.config, **override})

    assert refused.args[0].code() == KafkaError._TRANSPORT
    failures = [e for e in events if e.code() == KafkaError._AUTHENTICATION]
    assert failures
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in failures[0].str()
    assert all("not-the-password" not in e.str() for e in events)


def test_a_user_without_acls_may_do_nothing(
    secure_kafka: SecureKafka, secure_topic: Callable[..., str]
) -> None:
    topic = secure_topic()
    settings = secure_kafka.cluster.client_config("producer")
    outcomes: list[KafkaError | None] = []
    producer = kafka.producer(secure_kafka.bootstrap, {**settings, "log_level": 0})

    producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(30)

    assert [e.code() if e else None for e in outcomes] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert read_committed(secure_kafka, topic) == []


# ------------------------------------------------------------------ (b) replicated, acks=all


def test_admin_topics_are_replicated_three_times_with_min_isr_2(
    secure_kafka: SecureKafka, secure_topic: Callable[..., str]
) -> None:
    topic = secure_topic(partitions=3)
    producer = kafka.producer(secure_kafka.bootstrap, secure_kafka.config)  # idempotent, acks=all
    outcomes: list[KafkaError | None] = []
    for i in range(30):
        producer.produce(
            topic, f"v{i}".encode(), key=f"k{i}".encode(), on_delivery=lambda e, _m: outcomes.append(e)
        )
    assert producer.flush(30) == 0

    admin = kafka.admin(secure_kafka.bootstrap, secure_kafka.config)
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)

    assert outcomes == [None] * 30
    assert {p: (len(m.replicas), len(m.isrs)) for p, m in partitions.items()} == {
        0: (3, 3),
        1: (3, 3),
        2: (3, 3),
    }
    assert configs["min.insync.replicas"].value == "2"
    seen = Counter(v for _, v in read_committed(secure_kafka, topic))
    assert seen == Counter(f"v{i}".encode() for i in range(30))


def test_the_java_client_properties_file_names_the_admin_over_sasl_ssl(secure_kafka: SecureKafka) -> None:
    lines = dict(
        line.split("=", 1) for line in secure_kafka.properties_file.read_text().splitlines() if "=" in line
    )

    assert lines["bootstrap.servers"] == secure_kafka.bootstrap
    assert lines["security.protocol"] == "SASL_SSL"
    assert lines["sasl.mechanism"] == "SCRAM-SHA-512"
    assert 'username="admin"' in lines["sasl.jaas.config"]
    assert lines["ssl.truststore.type"] == "PEM"
    assert lines["ssl.truststore.location"] == secure_kafka.config["ssl.ca.location"]
    assert secure_kafka.properties_file.stat().st_mode & 0o077 == 0


def _cli(kafka_cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "TXBRIDGE_CACHE": str(kafka_cache)},
    )


def test_cli_start_asks_for_a_secured_cluster_of_three(tmp_path: Path) -> None:
    result = _cli(tmp_path, "kafka", "start", "--brokers", "3")

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the local cluster is secured and has 3 or more nodes: pass --brokers 3 --secure "
        "(or neither, for the single plaintext broker)"
    ]
    assert not (tmp_path / "kafka-cluster").exists()


def test_cli_status_names_every_node_and_the_properties_file(secure_kafka: SecureKafka) -> None:
    result = _cli(secure_kafka.cache, "kafka", "status")

    assert result.returncode == 0, result.stderr
    assert f"local cluster: 3 of 3 nodes up at {secure_kafka.bootstrap}" in result.stdout
    assert str(secure_kafka.properties_file) in result.stdout
    for node in secure_kafka.cluster.status().nodes:
        assert f"node {node.node_id}: up at {node.address}" in result.stdout
    assert secure_kafka.cluster.password() not in result.stdout + result.stderr


# ------------------------------------------------------------------ (c) the txbridge path over SASL_SSL


def test_a_committed_transaction_reaches_a_read_committed_consumer_once_over_sasl_ssl(
    secure_kafka: SecureKafka, secure_topic: Callable[..., str]
) -> None:
    namespace = f"txbs{uuid.uuid4().hex[:10]}"
    partitions = 3
    # txbridge.topics.init_topics takes no client settings: the same specs, created with them.
    kafka.ensure_topics(
        secure_kafka.bootstrap, internal_topics(namespace, partitions, 3), extra=secure_kafka.config
    )
    topic = secure_topic(partitions=3)
    config = CoordinatorConfig(
        bootstrap=secure_kafka.bootstrap,
        namespace=namespace,
        group_id=f"coord-{namespace}",
        secrets=Secrets(default=SECRET),
        check_delay_s=30.0,
        extra_config=secure_kafka.config,
    )

    with (
        running_coordinator(config) as service,
        TransactionProducer(
            secure_kafka.bootstrap,
            "orders-svc",
            secret=SECRET,
            check=lambda _txn: TxState.UNKNOWN,
            namespace=namespace,
            partitions=partitions,
            extra_config=dict(secure_kafka.config),
        ) as producer,
    ):
        committed = producer.send_in_transaction(
            Message(topic, b"paid", key=b"o-1"), lambda _t, _a: TxState.COMMIT
        )
        rolled_back = producer.send_in_transaction(
            Message(topic, b"never", key=b"o-2"), lambda _t, _a: TxState.ROLLBACK
        )
        deadline = time.monotonic() + 60
        while service.stats["op_records"] < 2 or service.stats["messages_republished"] < 1:
            assert time.monotonic() < deadline, f"the coordinator saw {dict(service.stats)}"
            time.sleep(0.2)

    assert (committed.state, rolled_back.state) == (TxState.COMMIT, TxState.ROLLBACK)
    assert read_committed(secure_kafka, topic) == [(b"o-1", b"paid")]
    admin = kafka.admin(secure_kafka.bootstrap, secure_kafka.config)
    internal = admin.list_topics(timeout=10).topics
    for name in ("__transaction_state", "__consumer_offsets"):
        assert {len(p.replicas) for p in internal[name].partitions.values()} == {3}, name
    delete_namespaces(secure_kafka.bootstrap, [namespace], extra=secure_kafka.config)


# ------------------------------------------------------------------ (d) a node dies and comes back


def _leader(secure: SecureKafka, topic: str, partition: int) -> int:
    admin = kafka.admin(secure.bootstrap, secure.config)
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)


def _isr_sizes(secure: SecureKafka, topic: str) -> list[int]:
    admin = kafka.admin(secure.bootstrap, secure.config)
    return sorted(len(p.isrs) for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values())


def _eventually(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.5)


def test_acks_all_survives_a_sigkilled_node_which_then_rejoins(
    secure_kafka: SecureKafka, secure_topic: Callable[..., str]
) -> None:
    cluster = secure_kafka.cluster
    topic = secure_topic(partitions=3)
    victim = _leader(secure_kafka, topic, 0)
    producer = kafka.producer(secure_kafka.bootstrap, {**secure_kafka.config, "message.timeout.ms": 60_000})
    outcomes: list[KafkaError | None] = []

    def send(values: range) -> None:
        for i in values:
            producer.produce(
                topic, f"v{i}".encode(), key=f"k{i}".encode(), on_delivery=lambda e, _m: outcomes.append(e)
            )
        assert producer.flush(90) == 0

    send(range(0, 20))
    assert cluster.kill_node(victim)
    assert cluster.status().up == [i for i in cluster.node_ids if i != victim]
    send(range(20, 60))  # acks=all with min ISR 2: two replicas of three are enough
    assert f"node {victim}: DOWN" in _cli(secure_kafka.cache, "kafka", "status").stdout
    _eventually(lambda: _isr_sizes(secure_kafka, topic) == [2, 2, 2], 60, "the dead node leaves every ISR")

    # A start that cannot happen is a one-line error, not a hang: its port is taken ...
    port = int(cluster.status().nodes[victim - 1].address.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the dead node's TIME_WAITs
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(BrokerError, match=rf"node {victim}'s client port {port} .* is taken"):
            cluster.start_node(victim)
    # ... or the JVM cannot start (a heap too small): the log's tail says why.
    broken = LocalCluster(cluster.home, heap="1k")
    with pytest.raises(
        BrokerError, match=rf"node {victim} of the local cluster exited with code 1"
    ) as failed:
        broken.start_node(victim, timeout=30)
    assert "Too small" in str(failed.value)
    assert broken.status().up == [i for i in cluster.node_ids if i != victim]

    cluster.start_node(victim)
    assert cluster.status().running
    _eventually(lambda: _isr_sizes(secure_kafka, topic) == [3, 3, 3], 90, "the node rejoins every ISR")
    send(range(60, 80))

    assert outcomes == [None] * 80
    seen = Counter(v for _, v in read_committed(secure_kafka, topic))
    assert seen == Counter(f"v{i}".encode() for i in range(80))  # each once: the producer is idempotent
