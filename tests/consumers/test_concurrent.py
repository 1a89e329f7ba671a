"""The concurrent consumer on a real broker: retries with delays, dead letters, tags, commits."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.consumers.conftest import FAST_GROUP, Calls, wait_committed
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.consumer import (
    ConcurrentConsumer,
    ConcurrentContext,
    ConsumeConcurrentlyStatus,
    ConsumedMessage,
    RetryPolicy,
)
from txbridge.consumer.retry import H_DUE
from txbridge.errors import ConfigurationError
from txbridge.wire import H_ORIGIN, H_REASON, H_RETRY_COUNT, H_TAGS, Topics

pytestmark = pytest.mark.integration

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER


def _produce(bootstrap: str, topic: str, values: list[bytes], tags: list[str | None] | None = None) -> None:
    producer = kafka.producer(bootstrap)
    for i, value in enumerate(values):
        tag = tags[i] if tags else None
        headers = [(H_TAGS, tag.encode())] if tag else []
        producer.produce(topic, key=b"k", value=value, headers=[*headers, ("user", b"u")], partition=0)
    assert producer.flush(15) == 0


def test_retries_come_after_their_delay_in_order_then_dead_letter(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=1)
    group = group_factory()
    namespace = f"ns{group[-6:]}"
    _produce(kafka_bootstrap, topic, [b"poison", *[b"ok-%d" % i for i in range(20)]])
    attempts = Calls()

    def listener(message: ConsumedMessage, context: ConcurrentContext) -> ConsumeConcurrentlyStatus:
        if message.value == b"poison":
            attempts.add(
                (time.time(), context.attempt, message.reconsume_times, message.header(H_RETRY_COUNT))
            )
            assert (message.topic, message.partition, message.offset) == (topic, 0, 0)
            return LATER
        calls.add((time.time(), message.value))
        return OK

    delays = [1.0, 2.0]
    consumer = ConcurrentConsumer(
        kafka_bootstrap,
        group,
        topic,
        listener,
        retry_policy=RetryPolicy(delays_s=delays, max_reconsume=2),
        namespace=namespace,
        workers=4,
        extra_config=FAST_GROUP,
    )
    with consumer:
        attempts.wait_until(lambda items: len(items) == 3)
        dead = wait_for(kafka_bootstrap, Topics(namespace).dead_letter(group), 1)
        committed = wait_committed(kafka_bootstrap, group, topic, 1)

    seen = attempts.snapshot()
    assert [(a, r, h) for _, a, r, h in seen] == [(1, 0, None), (2, 1, b"1"), (3, 2, b"2")]
    for n, delay in enumerate(delays):
        assert seen[n + 1][0] - seen[n][0] >= delay, f"retry {n + 1} came early"
    # The main flow never waited for the poison message's retries.
    assert len(calls.snapshot()) == 20
    assert max(t for t, _ in calls.snapshot()) < seen[1][0]
    assert committed == {0: 21}
    retries = read_topic(kafka_bootstrap, Topics(namespace).retry(group))
    assert [r.headers[H_RETRY_COUNT] for r in retries] == [b"1", b"2"]
    assert all(r.headers[H_ORIGIN] == f"{topic}/0/0".encode() for r in retries)
    assert all(r.headers["user"] == b"u" and H_DUE in r.headers for r in retries)
    assert len(dead) == 1
    assert dead[0].value == b"poison"
    assert dead[0].headers[H_RETRY_COUNT] == b"2"
    assert dead[0].headers[H_ORIGIN] == f"{topic}/0/0".encode()
    assert b"failed 3 times" in dead[0].headers[H_REASON]
    assert H_DUE not in dead[0].headers


def test_tags_filter_before_the_listener_and_filtered_offsets_commit(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=1)
    group = group_factory()
    tags: list[str | None] = ["TAGA", "TAGB", None, "TAGC"] * 5
    _produce(kafka_bootstrap, topic, [b"%d" % i for i in range(20)], tags)

    def listener(message: ConsumedMessage, _context: ConcurrentContext) -> ConsumeConcurrentlyStatus:
        calls.add((message.tag, int(message.value or b"")))
        return OK

    with ConcurrentConsumer(
        kafka_bootstrap, group, topic, listener, subscription="TAGB", extra_config=FAST_GROUP
    ):
        calls.wait_until(lambda items: len(items) >= 5)
        committed = wait_committed(kafka_bootstrap, group, topic, 1)

    assert sorted(calls.snapshot()) == [("TAGB", i) for i in range(1, 20, 4)]
    assert committed == {0: 20}


def test_malformed_tag_header_is_moved_to_dead_letter_not_dropped(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=1)
    group = group_factory()
    namespace = f"ns{group[-6:]}"
    producer = kafka.producer(kafka_bootstrap)
    producer.produce(topic, value=b"bad", headers=[(H_TAGS, b"\xff\xfe")], partition=0)
    producer.produce(topic, value=b"good", headers=[(H_TAGS, b"TAGA")], partition=0)
    assert producer.flush(15) == 0

    def listener(message: ConsumedMessage, _context: ConcurrentContext) -> ConsumeConcurrentlyStatus:
        calls.add(message.value)
        return OK

    with ConcurrentConsumer(
        kafka_bootstrap, group, topic, listener, namespace=namespace, extra_config=FAST_GROUP
    ):
        calls.wait_until(lambda items: b"good" in items)
        dead = wait_for(kafka_bootstrap, Topics(namespace).dead_letter(group), 1)
        assert wait_committed(kafka_bootstrap, group, topic, 1) == {0: 2}

    assert calls.snapshot() == [b"good"]
    assert [d.value for d in dead] == [b"bad"]
    assert b"malformed" in dead[0].headers[H_REASON]
    assert dead[0].headers[H_ORIGIN] == f"{topic}/0/0".encode()


def test_configuration_errors_fail_fast() -> None:
    with pytest.raises(ConfigurationError, match="subscription expression"):
        ConcurrentConsumer("localhost:1", "g", "t", lambda m, c: OK, subscription="TAGA ||")
    with pytest.raises(ConfigurationError, match="do not subscribe"):
        ConcurrentConsumer("localhost:1", "g", [Topics().retry("g")], lambda m, c: OK)
    with pytest.raises(ConfigurationError, match="group"):
        ConcurrentConsumer("localhost:1", "", "t", lambda m, c: OK)
