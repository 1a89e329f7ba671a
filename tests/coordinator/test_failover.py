"""Failover in seconds: a restart keeps its partitions, a dead owner's open transaction is fenced."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from coordinator.service import OWNER_PREFIX
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import _kafka
from txbridge.tools.local.coordinator_process import CoordinatorProcess
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

SESSION_S = 30


def test_a_dead_owners_open_transaction_is_fenced_at_takeover(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """A previous owner that died inside a Kafka transaction holds the real topic's last stable
    offset (read_committed consumers see nothing past it) and its partitions' offsets until the
    transaction times out; the next owner fences it instead of waiting."""
    topic = topic_factory()
    group = f"coord-{env.namespace}"  # the group Env.config gives the coordinators
    ghost_id = f"{group}-ghost"
    ghost = _kafka.producer(env.bootstrap, transactional_id=ghost_id, transaction_timeout_ms=120_000)
    ghost.init_transactions(30)
    members = _kafka.consumer(env.bootstrap, group)  # never joins: generation -1, as a dead owner's
    offsets = [
        TopicPartition(t, p, 0, OWNER_PREFIX + ghost_id)
        for t in (env.topics.half, env.topics.op)
        for p in range(PARTITIONS)
    ]
    ghost.begin_transaction()
    ghost.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
    ghost.commit_transaction(30)
    # It dies inside its next transaction: a message to the real topic, offsets pending.
    ghost.begin_transaction()
    ghost.produce(topic, key=b"k", value=b"from the dead owner")
    ghost.flush(30)
    ghost.send_offsets_to_transaction(offsets, members.consumer_group_metadata(), 30)
    members.close()

    handle = env.start()
    tx_id = env.producer.transaction([Msg(topic, b"after the takeover", key=b"k")], TxState.COMMIT)

    seen = wait_for(env.bootstrap, topic, 1, timeout=30)  # the ghost's transaction would hold it 120 s
    assert [s.headers.get("txb.tx") for s in seen] == [tx_id.encode()]
    # Counted when the fence's init_transactions returns, which the takeover does not wait for.
    assert eventually(lambda: handle.service.stats["owners_fenced"] == 1, timeout=30)
    assert [s.value for s in read_topic(env.bootstrap, topic, isolation="read_uncommitted")] == [
        b"from the dead owner",
        b"after the takeover",
    ]


def test_an_owner_still_in_the_group_is_waited_for_not_fenced(
    env: Env, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets held unstable by a previous owner that is still a member of the group (a live
    coordinator whose commit is slow on a loaded machine) are waited for, however short the
    wait before the owner is looked up: fencing would kill a live coordinator."""
    caplog.set_level(logging.INFO, logger="coordinator.service")
    topic = topic_factory()
    group = f"coord-{env.namespace}"
    owner_id = f"{group}-slow"
    owner = _kafka.producer(env.bootstrap, transactional_id=owner_id, transaction_timeout_ms=120_000)
    owner.init_transactions(30)
    member = _kafka.consumer(
        env.bootstrap,
        group,
        group_instance_id="slow",  # how the coordinators name their members
        group_protocol="classic",
        partition_assignment_strategy="range",
        session_timeout_ms=6_000,
    )
    assigned = threading.Event()
    member.subscribe([env.topics.half, env.topics.op], on_assign=lambda *_: assigned.set())
    stop = threading.Event()

    def stay_in_the_group() -> None:  # the one thread that calls the member (calls block each other)
        while not stop.is_set():
            member.poll(0.1)

    polling = threading.Thread(target=stay_in_the_group, name="slow-owner", daemon=True)
    try:
        deadline = time.monotonic() + 30
        while not assigned.is_set() and time.monotonic() < deadline:
            member.poll(0.1)
        assert assigned.is_set(), "the slow owner joined no group"
        offsets = [
            TopicPartition(t, p, 0, OWNER_PREFIX + owner_id)
            for t in (env.topics.half, env.topics.op)
            for p in range(PARTITIONS)
        ]
        owner.begin_transaction()  # a commit of every partition's offsets, as a coordinator's
        owner.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), 30)
        owner.commit_transaction(30)
        owner.begin_transaction()  # and the next, still open when the partitions move
        owner.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), 30)
        polling.start()

        handle = env.start(wait=False)
        assert eventually(lambda: "is still a group member: not fenced" in caplog.text, timeout=60)
        assert handle.service.stats["owners_fenced"] == 0
        assert not handle.service.running.is_set(), "served from offsets its owner had not committed"

        owner.commit_transaction(30)
        assert handle.service.running.wait(60), "the owner's commit did not let the coordinator start"
        # Not fenced: the owner goes on with its next transaction.
        owner.begin_transaction()
        owner.produce(topic, key=b"k", value=b"the owner's next")
        owner.commit_transaction(30)
        assert [r.value for r in read_topic(env.bootstrap, topic)] == [b"the owner's next"]
    finally:
        stop.set()
        if polling.is_alive():
            polling.join(5)
        member.close()


def test_a_restarted_coordinator_keeps_its_partitions_without_waiting_for_its_session(
    env: Env, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """Same instance id: the restart fences its previous incarnation's transaction and, as a static
    member, gets its partitions back without the group waiting out the old session."""
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
