"""A decided transaction always reaches its end: regressions of issue 13's stranded COMMIT."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import wait_for
from txbridge import kafka
from txbridge.wire import HalfMessage, TxState, new_tx_id

pytestmark = pytest.mark.integration


def _pending(env: Env) -> int:
    return sum(len(s.pending) for h in env.running for s in h.service.partitions.values())


@pytest.mark.parametrize("batches", [True, False], ids=["batches", "single-only"])
def test_checked_commit_is_published_when_a_malformed_half_follows_it(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], batches: bool
) -> None:
    """The back-check COMMIT waits for the half partition's end: a quarantined record is read too."""
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    check_server.batches = batches
    env.producer.heartbeat(check_server.url)
    handle = env.start()
    tx_id, partition = env.producer.halves([Msg(topic, b"v", key=b"k")])
    # A third-party producer's malformed record lands after it on the same half partition.
    env.producer.raw(env.topics.half, partition, b"garbage", b"no headers at all")

    seen = wait_for(env.bootstrap, topic, 1, timeout=30)

    assert [s.headers["txb.tx"] for s in seen] == [tx_id.encode()]
    assert eventually(lambda: _pending(env) == 0)
    assert handle.service.stats["quarantined_records"] == 1


def test_checked_commit_is_published_when_the_halves_were_written_in_a_kafka_transaction(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    """A transactional third-party producer leaves a commit marker after its half: the end offset
    lies past the last record, and the coordinator must count the marker as read."""
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url)
    handle = env.start()
    tx_id = new_tx_id()
    half = HalfMessage(tx_id, 0, topic, b"v", key=b"k", group="orders", instance="inst-1")
    partition = env.producer.partition_of(tx_id, [Msg(topic, b"v", key=b"k")])
    writer = kafka.producer(env.bootstrap, transactional_id=f"third-party-{tx_id}")
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(
        env.topics.half, key=half.record_key(), value=b"v", headers=half.to_headers(), partition=partition
    )
    writer.commit_transaction(30)

    seen = wait_for(env.bootstrap, topic, 1, timeout=30)

    assert [s.headers["txb.tx"] for s in seen] == [tx_id.encode()]
    assert eventually(lambda: _pending(env) == 0)
    assert handle.service.stats["resolved_published"] == 1
