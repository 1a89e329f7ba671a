"""Where a partition stands goes into the commit's transaction as offsets of the namespace's
positions group (txbridge/positions.py), and a partition an earlier txbridge served resumes from
the positions record it left in ``<ns>_state``, which the next commit deletes.

Read back with Kafka's admin API (OffsetFetch, require_stable), not with the coordinator's code.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.coordinator.conftest import PARTITIONS, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka, positions
from txbridge.wire import POSITIONS_KEY, Positions, TxState, half_partition

pytestmark = pytest.mark.integration


def _group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """The group's committed offsets and metadata, stable ones only, as Kafka's admin API reads them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], require_stable=True)[
        group
    ]
    answer = future.result(timeout=30)
    return {
        (tp.topic, tp.partition): (tp.offset, tp.metadata or "")
        for tp in answer.topic_partitions or []
        if tp.offset >= 0
    }


def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark."""
    client = kafka.consumer(bootstrap, "ends-reader", isolation_level="read_uncommitted")
    try:
        return {
            p: client.get_watermark_offsets(kafka.partition_at(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        client.close()


def _key_in(partition: int) -> bytes:
    keys = (f"key-{i}".encode() for i in itertools.count())
    return next(k for k in keys if half_partition(k, PARTITIONS) == partition)


def test_each_partition_resumes_from_the_namespace_groups_offsets_and_state_holds_no_positions(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    first = env.start()
    sent = [
        env.producer.transaction([Msg(topic, f"m{i}".encode(), key=_key_in(i % PARTITIONS))], TxState.COMMIT)
        for i in range(2 * PARTITIONS)
    ]
    wait_for(env.bootstrap, topic, len(sent))
    group = positions.group(env.namespace)
    half_ends, op_ends = _ends(env.bootstrap, env.topics.half), _ends(env.bootstrap, env.topics.op)
    expected = {
        **{(env.topics.half, p): end for p, end in half_ends.items()},
        **{(env.topics.op, p): end for p, end in op_ends.items()},
    }
    # Everything the coordinator consumed, the offsets cover: each partition's last commit
    # published its last transaction after both its halves and its COMMIT were read.
    assert eventually(
        lambda: {k: o for k, (o, _meta) in _group_offsets(env.bootstrap, group).items()} == expected
    )
    first.stop()
    assert [s for s in read_topic(env.bootstrap, env.topics.state) if s.key == POSITIONS_KEY] == []

    # A second coordinator under another group and instance resumes there: nothing again.
    second = env.start(group_id=f"renamed-{env.namespace}")
    after = env.producer.transaction([Msg(topic, b"after", key=_key_in(0))], TxState.COMMIT)
    wait_for(env.bootstrap, topic, len(sent) + 1)
    seen = read_topic(env.bootstrap, topic)
    assert sorted(s.headers["txb.tx"] for s in seen) == sorted(t.encode() for t in [*sent, after])
    assert second.service.stats["resolved_published"] == 1


def test_a_positions_record_an_earlier_txbridge_left_is_resumed_from_and_deleted_at_the_next_commit(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    key = _key_in(1)
    published_before, number = env.producer.halves([Msg(topic, b"before", key=key)])
    env.producer.op(published_before, number, TxState.COMMIT, count=1)
    # What an earlier txbridge's last commit of the partition left: it had published "before".
    half_end, op_end = (
        _ends(env.bootstrap, env.topics.half)[number],
        _ends(env.bootstrap, env.topics.op)[number],
    )
    env.producer.raw(env.topics.state, number, POSITIONS_KEY, Positions(half_end, op_end, "").encode())

    running = env.start()
    after = env.producer.transaction([Msg(topic, b"after", key=key)], TxState.COMMIT)
    seen = wait_for(env.bootstrap, topic, 1)
    assert [s.headers["txb.tx"] for s in seen] == [after.encode()]  # "before" lay below the record

    def record_deleted() -> bool:
        records = [s for s in read_topic(env.bootstrap, env.topics.state) if s.key == POSITIONS_KEY]
        return [(s.partition, s.value) for s in records][-1:] == [(number, None)]

    assert eventually(record_deleted)
    committed = _group_offsets(env.bootstrap, positions.group(env.namespace))
    assert committed[(env.topics.half, number)][0] > half_end
    assert committed[(env.topics.op, number)][0] > op_end
    running.stop()
    assert [s.headers["txb.tx"] for s in read_topic(env.bootstrap, topic)] == [after.encode()]
