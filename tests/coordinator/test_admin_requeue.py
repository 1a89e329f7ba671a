"""Quarantined committed transactions, listed and requeued through a real coordinator (issue 13)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from cli.main import main
from tests.coordinator.conftest import PARTITIONS, Env, RunningCoordinator, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.wire import OpSource, TxState, decode_op

pytestmark = pytest.mark.integration

# The coordinator's producer would create a missing topic on a broker that auto-creates
# them (the local one does); with this it quarantines the transaction, as on most clusters.
NO_AUTO_CREATE = {"allow.auto.create.topics": False}


def _admin(env: Env, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["admin", *args, "--bootstrap", env.bootstrap, "--namespace", env.namespace]
    )


def _pending(env: Env) -> int:
    return sum(len(s.pending) for h in env.running for s in h.service.partitions.values())


def _restart(env: Env, handle: RunningCoordinator, **overrides: Any) -> RunningCoordinator:
    # The coordinator remembers a topic's metadata for 30 s: a new instance asks the broker again.
    handle.stop()
    return env.start(**overrides)


def _create(env: Env, *topics: str) -> None:
    kafka.ensure_topics(env.bootstrap, [kafka.TopicSpec(t, 1) for t in topics])


def _entry(listing: str, tx_id: str) -> tuple[str, str]:
    """The two lines ``admin quarantine`` prints for ``tx_id``."""
    lines = listing.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(tx_id))
    return lines[at], lines[at + 1]


def _requeued_as(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output.split("requeued as ")[1].split()[0]


def test_a_transaction_whose_topic_did_not_exist_is_requeued_once_the_topic_exists(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("missing")
    handle = env.start(extra_config=NO_AUTO_CREATE)
    tx_id = env.producer.transaction(
        [Msg(topic, b"one", key=b"k", headers=(("trace", b"t1"),)), Msg(topic, b"two", key=b"k")],
        TxState.COMMIT,
    )
    quarantined = wait_for(env.bootstrap, env.topics.quarantine, 2)
    assert {s.headers["txb.tx"] for s in quarantined} == {tx_id.encode()}

    listed = _admin(env, "quarantine")
    assert listed.exit_code == 0, listed.output
    line, details = _entry(listed.output, tx_id)
    assert "orders" in line
    assert "requeueable" in line
    assert f"origin {env.topics.half}/" in details
    assert f"topics {topic}" in details
    assert "does not exist" in details

    early = _admin(env, "requeue", tx_id)
    assert early.exit_code == 2
    assert f"topic {topic} does not exist: create it" in early.output

    _create(env, topic)
    handle = _restart(env, handle, extra_config=NO_AUTO_CREATE)
    new_tx = _requeued_as(_admin(env, "requeue", tx_id))

    seen = wait_for(env.bootstrap, topic, 2)
    assert [(s.key, s.value) for s in seen] == [(b"k", b"one"), (b"k", b"two")]
    assert seen[0].headers == {"trace": b"t1", "txb.tx": new_tx.encode()}
    ops = [decode_op(s.value) for s in read_topic(env.bootstrap, env.topics.op)]
    requeue_op = next(o for o in ops if o.tx_id == new_tx)
    assert (requeue_op.state, requeue_op.source, requeue_op.count) == (TxState.COMMIT, OpSource.ADMIN, 2)
    assert requeue_op.reason == f"requeue of {tx_id}"

    again = _admin(env, "requeue", tx_id)
    assert again.exit_code == 2
    assert f"transaction {tx_id} was already requeued as {new_tx} by an admin" in again.output
    assert "requeued as " + new_tx in _admin(env, "quarantine").output
    assert eventually(lambda: _pending(env) == 0)
    assert handle.service.stats["messages_republished"] == 2
    assert len(read_topic(env.bootstrap, topic)) == 2


def test_requeue_all_requeues_each_transaction_once_and_skips_raw_records(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    first_topic, second_topic = unique_name("missing"), unique_name("missing")
    handle = env.start(extra_config=NO_AUTO_CREATE)
    first = env.producer.transaction([Msg(first_topic, b"a")], TxState.COMMIT)
    second = env.producer.transaction([Msg(second_topic, b"b", key=b"kb")], TxState.COMMIT)
    env.producer.raw(env.topics.half, 0, b"raw-key", b"no headers at all")
    wait_for(env.bootstrap, env.topics.quarantine, 3)

    listed = _admin(env, "quarantine").output
    raw_line = next(line for line in listed.splitlines() if line.startswith("raw-key"))
    assert "raw record, not requeueable" in raw_line
    refused = _admin(env, "requeue", "raw-key")
    assert refused.exit_code == 2
    assert "raw record" in refused.output

    _create(env, first_topic, second_topic)
    handle = _restart(env, handle, extra_config=NO_AUTO_CREATE)
    everything = _admin(env, "requeue", "--all")
    assert everything.exit_code == 0, everything.output
    assert sorted(line.split(":")[0] for line in everything.output.splitlines()) == sorted([first, second])

    assert [s.value for s in wait_for(env.bootstrap, first_topic, 1)] == [b"a"]
    assert [(s.key, s.value) for s in wait_for(env.bootstrap, second_topic, 1)] == [(b"kb", b"b")]
    nothing_left = _admin(env, "requeue", "--all")
    assert nothing_left.exit_code == 0, nothing_left.output
    assert "no requeueable transactions" in nothing_left.output
    assert eventually(lambda: _pending(env) == 0)
    assert handle.service.stats["messages_republished"] == 2
    assert len(read_topic(env.bootstrap, first_topic)) == len(read_topic(env.bootstrap, second_topic)) == 1


def test_a_message_over_the_size_limit_is_quarantined_again_until_the_limit_is_raised(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    handle = env.start(max_message_bytes=10_000)
    tx_id = env.producer.transaction(
        [Msg(topic, b"small", key=b"k"), Msg(topic, b"x" * 20_000, key=b"k")], TxState.COMMIT
    )
    wait_for(env.bootstrap, env.topics.quarantine, 2)

    # The cause is still there: the requeue goes through the coordinator and comes back.
    retry = _requeued_as(_admin(env, "requeue", tx_id))
    aside = wait_for(env.bootstrap, env.topics.quarantine, 5)  # two copies, the marker, two copies
    copies = [s for s in aside if "txb.origin" in s.headers]
    assert [s.headers["txb.tx"] for s in copies] == [tx_id.encode()] * 2 + [retry.encode()] * 2
    listing = _admin(env, "quarantine").output
    assert f"requeued as {retry}" in _entry(listing, tx_id)[0]
    line, details = _entry(listing, retry)
    assert "requeueable" in line
    assert f"requeue of {tx_id}" in details
    assert "above max_message_bytes=10000" in details

    handle = _restart(env, handle, max_message_bytes=100_000)
    final = _requeued_as(_admin(env, "requeue", retry))

    seen = wait_for(env.bootstrap, topic, 2)
    assert [(s.value or b"")[:5] for s in seen] == [b"small", b"xxxxx"]
    assert len(seen[1].value or b"") == 20_000
    assert {s.headers["txb.tx"] for s in seen} == {final.encode()}
    assert _admin(env, "requeue", tx_id).exit_code == 2
    assert eventually(lambda: _pending(env) == 0)
    assert len(read_topic(env.bootstrap, topic)) == 2


def test_a_requeue_whose_commit_is_read_before_its_halves_is_published_once(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    """The requeue's halves and COMMIT are one Kafka transaction; here the op partition's marker
    is readable first (an unrelated open transaction holds every half partition's last stable
    offset below the halves). The COMMIT must wait for the halves, not be settled at the last
    stable offset as an orphan."""
    topic = unique_name("missing")
    handle = env.start(extra_config=NO_AUTO_CREATE)
    tx_id = env.producer.transaction(
        [Msg(topic, b"one", key=b"k"), Msg(topic, b"two", key=b"k")], TxState.COMMIT
    )
    wait_for(env.bootstrap, env.topics.quarantine, 2)
    _create(env, topic)
    handle = _restart(env, handle, extra_config=NO_AUTO_CREATE)

    holder = Producer({"bootstrap.servers": env.bootstrap, "transactional.id": unique_name("holder")})
    holder.init_transactions(30)
    holder.begin_transaction()
    for partition in range(PARTITIONS):
        holder.produce(env.topics.half, b"held", key=b"held", partition=partition)
    holder.flush(30)
    try:
        new_tx = _requeued_as(_admin(env, "requeue", tx_id))
        # The coordinator reads the COMMIT now; the halves stay unreadable until the holder ends.
        assert eventually(lambda: _committed_seen(env, new_tx) or handle.service.stats["orphan_ops"] > 0)
        time.sleep(3.0)  # several commit boundaries: the old end offset settled the COMMIT here
        assert read_topic(env.bootstrap, topic) == []
    finally:
        holder.abort_transaction(30)

    seen = wait_for(env.bootstrap, topic, 2)
    assert [(s.key, s.value) for s in seen] == [(b"k", b"one"), (b"k", b"two")]
    assert {s.headers["txb.tx"] for s in seen} == {new_tx.encode()}
    assert eventually(lambda: _pending(env) == 0)
    assert handle.service.stats["orphan_ops"] == 0
    time.sleep(1.0)
    assert len(read_topic(env.bootstrap, topic)) == 2


def _committed_seen(env: Env, tx_id: str) -> bool:
    """A coordinator holds ``tx_id`` decided (its COMMIT op was read)."""
    return any(
        tx_id in s.pending and s.pending[tx_id].decision is not None
        for h in env.running
        for s in h.service.partitions.values()
    )
