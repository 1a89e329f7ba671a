"""Failover in seconds: a restart keeps its partitions, a dead owner's open transaction is aborted."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from servers.coordinator_process import CoordinatorProcess
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

SESSION_S = 30


def test_a_dead_owners_open_transaction_is_aborted_at_takeover(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """A previous owner that died inside its partitions' Kafka transactions holds the real
    topic's last stable offset (read_committed consumers see nothing past it) and the
    partitions' offsets until those transactions time out. The next owner, under another
    instance id, claims the partitions' transactional ids, which aborts them at once."""
    topic = topic_factory()
    config = env.config()
    members = kafka.consumer(env.bootstrap, config.group_id)  # never joins: generation -1, as a dead owner's
    ghosts = []
    for p in range(PARTITIONS):
        ghost = kafka.producer(
            env.bootstrap,
            transactional_id=config.partition_transactional_id(p),
            transaction_timeout_ms=120_000,
        )
        ghost.init_transactions(30)
        offsets = [TopicPartition(t, p, 0) for t in (env.topics.half, env.topics.op)]
        ghost.begin_transaction()
        ghost.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
        ghost.commit_transaction(30)
        # It dies inside its next transaction: a message to the real topic, offsets pending.
        ghost.begin_transaction()
        ghost.produce(topic, key=b"k", value=f"from the dead owner of {p}".encode())
        ghost.flush(30)
        ghost.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
        ghosts.append(ghost)
    members.close()

    handle = env.start()
    tx_id = env.producer.transaction([Msg(topic, b"after the takeover", key=b"k")], TxState.COMMIT)

    seen = wait_for(env.bootstrap, topic, 1, timeout=30)  # the ghosts' transactions would hold it 120 s
    assert [s.headers.get("txb.tx") for s in seen] == [tx_id.encode()]
    assert handle.service.stats["owners_fenced"] == PARTITIONS
    assert [s.value for s in read_topic(env.bootstrap, topic, isolation="read_uncommitted")] == [
        *(f"from the dead owner of {p}".encode() for p in range(PARTITIONS)),
        b"after the takeover",
    ]


def test_offsets_held_by_a_transaction_of_an_unknown_id_are_waited_for(
    env: Env, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets held unstable by a transaction under an id that is no partition's (another tool,
    an older txbridge) are waited for, not read past: serving from them could publish what is
    published already, or skip what is not."""
    caplog.set_level(logging.WARNING, logger="coordinator.service")
    topic = topic_factory()
    group = f"coord-{env.namespace}"  # the group Env.config gives the coordinators
    owner = kafka.producer(env.bootstrap, transactional_id=f"{group}-other", transaction_timeout_ms=120_000)
    owner.init_transactions(30)
    members = kafka.consumer(env.bootstrap, group)  # never joins: generation -1
    offsets = [TopicPartition(t, p, 0) for t in (env.topics.half, env.topics.op) for p in range(PARTITIONS)]
    owner.begin_transaction()
    owner.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
    owner.commit_transaction(30)
    owner.begin_transaction()  # and the next, still open when the coordinator starts
    owner.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
    members.close()

    handle = env.start(wait=False)
    assert eventually(lambda: "are not stable yet" in caplog.text, timeout=60)
    assert not handle.service.running.is_set(), "served from offsets still held by an open transaction"

    owner.commit_transaction(30)
    assert handle.service.running.wait(60), "the transaction's commit did not let the coordinator start"
    tx_id = env.producer.transaction([Msg(topic, b"after", key=b"k")], TxState.COMMIT)
    assert [s.headers.get("txb.tx") for s in wait_for(env.bootstrap, topic, 1)] == [tx_id.encode()]


def test_a_restarted_coordinator_keeps_its_partitions_without_waiting_for_its_session(
    env: Env, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """Same instance id: as a static member, the restart gets its partitions back without the
    group waiting out the old session (and its claim aborts what the old incarnation left open)."""
    topic = topic_factory()
    proc = CoordinatorProcess(
        env.bootstrap,
        env.namespace,
        secret=SECRET,
        log_path=tmp_path / "coordinator.log",
        # A long session: without static membership the restart would wait it out (30 s).
        args=(
            "--group-id",
            f"proc-{uuid.uuid4().hex[:8]}",
            "--check-invariants",
            "--kafka-config",
            f"session.timeout.ms={SESSION_S * 1000}",
        ),
        instance_id="restarted",
    )
    proc.start()
    try:
        proc.wait_ready()
        first = env.producer.transaction([Msg(topic, b"before", key=b"k")], TxState.COMMIT)
        assert len(wait_for(env.bootstrap, topic, 1)) == 1

        proc.kill()
        killed = time.monotonic()
        proc.start()
        second = env.producer.transaction([Msg(topic, b"after", key=b"k")], TxState.COMMIT)
        seen = wait_for(env.bootstrap, topic, 2, timeout=30)
        took = time.monotonic() - killed

        assert [s.headers["txb.tx"] for s in seen] == [first.encode(), second.encode()]
        # Published long before the killed member's session could have expired: no rebalance wait.
        assert took < SESSION_S * 2 / 3, f"{took:.1f}s"
        assert eventually(lambda: "assigned partitions" in proc.log_tail(50))
    finally:
        proc.stop()
