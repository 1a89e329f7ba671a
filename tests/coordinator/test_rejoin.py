"""A coordinator whose consumer is fenced out of its static membership joins again in-process.

librdkafka fences its own static member when the broker acting as the group's coordinator
dies (the broker-chaos run saw it at every such kill). The same fatal error is provoked here
without killing a broker: another consumer joins with the coordinator's group.instance.id.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import coordinator.assembly as service_module
from coordinator.commit import cycle as commit_cycle
from coordinator.group import clients
from coordinator.monitoring.metrics import Stat
from coordinator.monitoring.watchdog import Watchdog
from coordinator.service import Coordinator
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def _consumer_protocol(env: Env) -> bool:
    return env.config().group_protocol == "consumer"


def _fence_static_member(env: Env, instance_id: str) -> None:
    """Join the coordinators' group as ``instance_id``: under the classic protocol the broker
    fences the member holding it; under the consumer protocol it refuses the newcomer instead
    (UNRELEASED_INSTANCE_ID), which this asserts."""
    protocol = (
        {"group_protocol": "consumer", "group_remote_assignor": "range"}
        if _consumer_protocol(env)
        else {
            "group_protocol": "classic",
            "partition_assignment_strategy": "range",
            "session_timeout_ms": 6000,
        }
    )
    group = f"coord-{env.namespace}"
    intruder = kafka.consumer(env.bootstrap, group, group_instance_id=instance_id, **protocol)
    refused = None
    try:
        intruder.subscribe([env.topics.half, env.topics.op])
        deadline = time.monotonic() + 30
        while not intruder.assignment() and refused is None and time.monotonic() < deadline:
            msg = intruder.poll(0.2)
            if msg is not None and msg.error() is not None and kafka.is_unreleased_instance(msg.error()):
                refused = msg.error()
        if _consumer_protocol(env):
            assert refused is not None, "the broker did not refuse a second member under a held instance id"
        else:
            assert intruder.assignment(), "the intruding consumer got no partitions"
    finally:
        intruder.close()  # a static member leaves without LeaveGroup: the coordinator's rejoin replaces it


def test_a_fenced_static_member_rejoins_and_publishes_everything_once(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    running = env.start(instance_id="rejoiner")
    before = [
        env.producer.transaction([Msg(topic, f"before-{i}".encode(), key=b"k")], TxState.COMMIT)
        for i in range(5)
    ]
    wait_for(env.bootstrap, topic, 5)
    # Halves whose COMMIT comes after the fencing: their state must be rebuilt by the new consumer.
    open_tx, partition = env.producer.halves(
        [Msg(topic, b"open-0", key=b"k"), Msg(topic, b"open-1", key=b"k")]
    )

    _fence_static_member(env, "rejoiner")

    if _consumer_protocol(env):  # the intruder was refused: the coordinator serves on untouched
        assert running.service.stats[Stat.CONSUMER_REJOINS] == 0
    else:
        assert eventually(lambda: running.service.stats[Stat.CONSUMER_REJOINS] >= 1, timeout=60)
    assert eventually(running.service.running.is_set, timeout=60)
    env.producer.op(open_tx, partition, TxState.COMMIT, count=2)
    after = [
        env.producer.transaction([Msg(topic, f"after-{i}".encode(), key=b"k")], TxState.COMMIT)
        for i in range(5)
    ]
    wait_for(env.bootstrap, topic, 12, timeout=60)
    time.sleep(2)  # a duplicate would show up now

    seen = read_topic(env.bootstrap, topic)
    assert [s.value for s in seen] == [
        *(f"before-{i}".encode() for i in range(5)),
        b"open-0",
        b"open-1",
        *(f"after-{i}".encode() for i in range(5)),
    ]
    assert {s.headers["txb.tx"] for s in seen} == {t.encode() for t in [*before, open_tx, *after]}
    assert running.thread.is_alive()
    assert running.errors == []


def test_a_consumer_fenced_again_and_again_stops_the_coordinator(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "REJOINS_MAX", 0)  # the first fencing counts as "another process"
    running = env.start(instance_id="twin")
    if _consumer_protocol(env):
        # The broker refuses the second coordinator under the same instance id, and goes on
        # refusing it after the wait for a crashed previous life's session: it stops.
        monkeypatch.setattr(clients, "UNRELEASED_WAIT_S", 2.0)
        monkeypatch.setattr(clients, "UNRELEASED_RETRY_S", 0.5)
        second = env.start(instance_id="twin", wait=False)
        second.thread.join(60)
        assert not second.thread.is_alive()
        assert len(second.errors) == 1
        assert isinstance(second.errors[0], KafkaOperationError)
        assert "instance id twin" in str(second.errors[0]).lower()
        assert running.thread.is_alive()
        assert running.service.stats[Stat.CONSUMER_REJOINS] == 0
        return
    _fence_static_member(env, "twin")
    running.thread.join(60)
    assert not running.thread.is_alive()
    assert len(running.errors) == 1
    assert isinstance(running.errors[0], KafkaOperationError)
    assert "fenced" in str(running.errors[0]).lower()  # through the consumer or the offsets commit


def test_a_fatal_producer_error_renews_the_clients_and_loses_nothing(
    env: Env, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka's remedy for a fatal producer error (the chaos run's "sequence desynchronization"
    after a leader failover) is a new client. The fault is raised at the commit of a transaction
    that republished messages; the broker and every client are real, so the open transaction is
    really aborted by the partition's next claim, and its messages come again once."""
    topic = topic_factory()
    armed: list[int] = []  # the republished count when armed
    end_transaction = commit_cycle.CommitCycle._end_transaction

    def failing(self: commit_cycle.CommitCycle, producer: Any, *, commit: bool) -> None:
        if commit and armed and self.stats[Stat.MESSAGES_REPUBLISHED] > armed[0]:
            armed.clear()
            error = KafkaError(KafkaError._FATAL, "sequence desynchronization (injected)", fatal=True)
            raise KafkaException(error)
        end_transaction(self, producer, commit=commit)

    monkeypatch.setattr(commit_cycle.CommitCycle, "_end_transaction", failing)
    running = env.start(instance_id="renewed")
    before = [
        env.producer.transaction([Msg(topic, f"before-{i}".encode(), key=b"k")], TxState.COMMIT)
        for i in range(3)
    ]
    wait_for(env.bootstrap, topic, 3)
    armed.append(int(running.service.stats[Stat.MESSAGES_REPUBLISHED]))
    after = [
        env.producer.transaction([Msg(topic, f"after-{i}".encode(), key=b"k")], TxState.COMMIT)
        for i in range(5)
    ]

    wait_for(env.bootstrap, topic, 8, timeout=60)
    time.sleep(2)  # a duplicate would show up now

    assert armed == [], "the fault was never raised"
    assert running.service.stats[Stat.PRODUCER_FATAL_ERRORS] == 1
    assert running.service.stats[Stat.CONSUMER_REJOINS] == 1
    seen = read_topic(env.bootstrap, topic)
    assert [s.value for s in seen] == [
        *(f"before-{i}".encode() for i in range(3)),
        *(f"after-{i}".encode() for i in range(5)),
    ]
    assert {s.headers["txb.tx"] for s in seen} == {t.encode() for t in [*before, *after]}
    assert running.thread.is_alive()
    assert running.errors == []


def test_a_stuck_commit_is_abandoned_in_process_and_loses_nothing(
    env: Env, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka call that outlives its timeout cannot be interrupted (librdkafka#5511 was one:
    ``send_offsets_to_transaction`` waited forever once the group coordinator's broker died).
    Here the first commit the commit cycle ends blocks for real (a wrapped client). The
    watchdog reports it, the loop abandons that producer to its thread and replaces the
    clients in-process: no exit (the wedge hook, which the CLI turns into exit 75, is not
    called), and the transaction is published once after the partitions' next claim, which
    fences the abandoned producer."""
    monkeypatch.setattr(commit_cycle, "TXN_CALL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(service_module, "Watchdog", functools.partial(Watchdog, grace_s=1.0, poll_s=0.1))
    topic = topic_factory()
    release = threading.Event()
    stuck: list[str] = []
    original = kafka.producer

    class Stuck:
        """A transactional producer whose first commit_transaction on a commit thread does not return."""

        def __init__(self, inner: Any, transactional_id: str) -> None:
            self._inner, self._id = inner, transactional_id

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def commit_transaction(self, *args: Any) -> None:
            if not stuck and threading.current_thread().name.startswith(commit_cycle.THREAD_PREFIX):
                stuck.append(self._id)
                release.wait(120)  # as librdkafka's call waited for a coordinator that was gone
            self._inner.commit_transaction(*args)

    def producer(bootstrap: str, extra: Any = None, **defaults: Any) -> Any:
        made = original(bootstrap, extra, **defaults)
        return Stuck(made, defaults["transactional_id"]) if "transactional_id" in defaults else made

    monkeypatch.setattr(kafka, "producer", producer)
    wedged: list[Any] = []
    service = Coordinator(env.config(instance_id="unstuck"), on_wedged=wedged.append)
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    try:
        assert service.running.wait(60)
        sent = [
            env.producer.transaction([Msg(topic, f"m{i}".encode(), key=f"k{i}".encode())], TxState.COMMIT)
            for i in range(6)
        ]
        wait_for(env.bootstrap, topic, len(sent), timeout=60)
        time.sleep(2)  # a duplicate would show up now

        assert stuck, "no commit was held"
        # At least the held one: with the test's 1 s timeout and 1 s grace, a real commit on a
        # loaded box (the one right after the fence of the abandoned id) can be reported too, and
        # is handled the same way.
        assert service.stats[Stat.COMMITS_WEDGED] >= 1
        assert service.stats[Stat.CONSUMER_REJOINS] >= 1
        assert wedged == [], "the wedge hook (the CLI's exit 75) was called"
        assert thread.is_alive()
        seen = read_topic(env.bootstrap, topic)
        assert sorted(s.headers["txb.tx"] for s in seen) == sorted(t.encode() for t in sent)
    finally:
        release.set()
        service.stop()
        thread.join(60)
