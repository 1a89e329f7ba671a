"""One committer per namespace partition, whatever the coordinators' group.

A second coordinator group on a namespace that a live group serves is refused at start, naming
the group; should two groups run all the same (both started at once, or a group this principal
may not describe), each owner's claim fences the other's and nothing is published twice, and the
newcomer of the two, fenced, stops with the same refusal. Moving a namespace to a new group is
stopping the old one and starting the new: nothing is lost, nothing published twice.
What is asserted is what a read_committed consumer of the real topic sees.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.group import clients, membership
from servers.coordinator_process import CoordinatorProcess
from tests.coordinator.conftest import SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic
from txbridge.errors import ConfigurationError
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def _published(env: Env, topic: str) -> Counter[str]:
    """How many times a read_committed reader of ``topic`` sees each transaction."""
    return Counter(s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic))


def _committed(env: Env, topic: str, count: int, prefix: str) -> list[str]:
    return [
        env.producer.transaction(
            [Msg(topic, f"{prefix}-{i}".encode(), key=f"k{i % 7}".encode())], TxState.COMMIT
        )
        for i in range(count)
    ]


def test_a_second_group_on_a_served_namespace_is_refused_naming_the_group(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    first = env.start(group_id=f"first-{env.namespace}")
    second = env.start(group_id=f"second-{env.namespace}", wait=False)
    second.thread.join(60)

    assert not second.thread.is_alive()
    assert len(second.errors) == 1
    refusal = second.errors[0]
    assert isinstance(refusal, ConfigurationError)
    assert f"served by coordinator group 'first-{env.namespace}'" in str(refusal)
    assert f"--group-id first-{env.namespace}" in str(refusal)
    # The first group serves on, alone.
    txs = _committed(env, topic, 20, "a")
    assert eventually(lambda: set(_published(env, topic)) >= set(txs))
    assert all(n == 1 for n in _published(env, topic).values())
    assert first.thread.is_alive()


def test_two_groups_running_on_one_namespace_publish_each_transaction_once(
    env: Env, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both groups running, as when they start at the same moment: the refusal cannot see it.
    Neither counts as the newcomer here, so that they fence each other throughout."""
    monkeypatch.setattr(membership, "refuse_another_group", lambda *args: None)
    monkeypatch.setattr(clients, "NEWCOMER_S", 0.0)
    topic = topic_factory()
    env.start(group_id=f"one-{env.namespace}")
    env.start(group_id=f"two-{env.namespace}")

    txs = _committed(env, topic, 60, "b")

    assert eventually(lambda: set(_published(env, topic)) >= set(txs), timeout=90)
    published = _published(env, topic)
    assert {tx: n for tx, n in published.items() if n != 1} == {}
    assert set(published) == set(txs)


def test_a_second_group_that_slipped_in_stops_when_fenced_and_the_first_serves_on(
    env: Env, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started while the first group rebalanced (the start's refusal saw no member holding
    partitions), the second group claims them, and the first claims them back. The newcomer,
    fenced, refuses as at the start; the first group's members rejoin and never stop."""
    monkeypatch.setattr(clients, "NEWCOMER_S", 15.0)
    topic = topic_factory()
    started = time.monotonic()
    first = env.start(group_id=f"first-{env.namespace}")
    before = _committed(env, topic, 10, "before")
    assert eventually(lambda: set(_published(env, topic)) >= set(before))
    time.sleep(max(0.0, clients.NEWCOMER_S - (time.monotonic() - started)))  # the first is no newcomer
    monkeypatch.setattr(membership, "refuse_another_group", lambda *args: None)
    second = env.start(group_id=f"second-{env.namespace}", wait=False)

    during: list[str] = []
    deadline = time.monotonic() + 90
    while second.thread.is_alive() and time.monotonic() < deadline:
        during += _committed(env, topic, 5, f"during{len(during)}")
        time.sleep(0.2)
    after = _committed(env, topic, 10, "after")

    assert not second.thread.is_alive(), "the second group's coordinator was not fenced, or did not stop"
    assert [type(e) for e in second.errors] == [ConfigurationError]
    assert f"served by coordinator group 'first-{env.namespace}'" in str(second.errors[0])
    assert first.thread.is_alive()
    assert not first.errors
    expected = {*before, *during, *after}
    assert eventually(lambda: set(_published(env, topic)) >= expected, timeout=60)
    published = _published(env, topic)
    assert set(published) == expected
    assert {tx: n for tx, n in published.items() if n != 1} == {}


def test_moving_a_namespace_to_a_new_group_loses_and_repeats_nothing(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """The documented procedure: stop every coordinator of the old group, start the new one.
    Transactions still open at the move (no decision yet) are decided under the new group."""
    topic = topic_factory()
    old = env.start(group_id=f"old-{env.namespace}", check_delay_s=60.0)
    before = _committed(env, topic, 10, "before")
    open_ones = [env.producer.halves([Msg(topic, f"open-{i}".encode(), key=b"o")]) for i in range(5)]
    assert eventually(lambda: set(_published(env, topic)) >= set(before))
    old.stop()

    env.start(group_id=f"new-{env.namespace}", check_delay_s=60.0)
    for tx_id, partition in open_ones:
        env.producer.op(tx_id, partition, TxState.COMMIT, count=1)
    after = _committed(env, topic, 10, "after")

    expected = set(before) | {tx for tx, _ in open_ones} | set(after)
    assert eventually(lambda: set(_published(env, topic)) >= expected, timeout=60)
    published = _published(env, topic)
    assert set(published) == expected
    assert all(n == 1 for n in published.values())
    # Per-key order across the move: the open ones were published in the order they began.
    order = [s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic) if s.key == b"o"]
    assert order == [tx for tx, _ in open_ones]


def test_the_coordinator_command_exits_with_the_refusal(env: Env, tmp_path: Path) -> None:
    env.start(group_id=f"first-{env.namespace}")
    process = CoordinatorProcess(
        env.bootstrap,
        env.namespace,
        secret=SECRET,
        log_path=tmp_path / "second.log",
        args=("--group-id", f"second-{env.namespace}"),
    )
    process.start()
    try:
        assert eventually(lambda: not process.alive(), timeout=60)
    finally:
        code = process.stop()
    log = (tmp_path / "second.log").read_text()
    assert code not in (0, None)
    assert f"namespace {env.namespace} is served by coordinator group 'first-{env.namespace}'" in log
    assert "Traceback" not in log
