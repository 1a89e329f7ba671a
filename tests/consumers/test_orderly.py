"""The orderly consumer on a real broker: order, suspension, dead letters, tags, commits."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from tests.consumers.conftest import FAST_GROUP, Calls, end_offsets, wait_committed
from tests.kafka_helpers import eventually, wait_for
from txbridge import kafka
from txbridge.consumer import ConsumedMessage, ConsumeOrderlyStatus, OrderlyConsumer, OrderlyContext
from txbridge.errors import ConfigurationError
from txbridge.ordered import OrderedMessage, OrderedProducer, select_partition
from txbridge.wire import H_ORIGIN, H_REASON, H_RETRY_COUNT, Topics

pytestmark = pytest.mark.integration

SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def _key_seq(message: ConsumedMessage) -> tuple[str, int]:
    key, seq = message.value.decode().split(":")  # type: ignore[union-attr]
    return key, int(seq)


def test_per_key_order_survives_random_suspensions(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=3)
    keys = [f"order-{i}" for i in range(6)]
    with OrderedProducer(kafka_bootstrap) as producer:
        sent_to = {}
        for seq in range(25):
            for key in keys:
                sent_to[key] = producer.send(topic, f"{key}:{seq}".encode(), key=key.encode())
    assert len(set(sent_to.values())) > 1  # the keys really spread over partitions
    rng = random.Random(7)
    rng_lock = threading.Lock()
    suspensions = Calls()

    def listener(message: ConsumedMessage, context: OrderlyContext) -> ConsumeOrderlyStatus:
        with rng_lock:
            fail = rng.random() < 0.25
        if fail:
            suspensions.add(_key_seq(message))
            context.suspend_s = 0.02
            return SUSPEND
        calls.add(_key_seq(message))
        return SUCCESS

    consumer = OrderlyConsumer(kafka_bootstrap, group_factory(), [topic], listener, extra_config=FAST_GROUP)
    with consumer:
        done = calls.wait_until(lambda items: len(items) >= 150)

    assert len(suspensions.snapshot()) > 10  # the listener really suspended, often
    for key in keys:
        assert [seq for k, seq in done if k == key] == list(range(25)), key
    for key, partition in sent_to.items():
        assert partition == select_partition(OrderedMessage(topic, b"", key=key.encode()), 3)


def test_poison_message_goes_to_dead_letter_and_partition_moves_on(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=1)
    group = group_factory()
    namespace = f"ns{group[-6:]}"
    with OrderedProducer(kafka_bootstrap) as producer:
        for seq in range(5):
            producer.send(
                topic, f"k:{seq}".encode(), key=b"k", headers=[("trace", b"t-%d" % seq)], tags="TAGA"
            )
    attempts = Calls()

    def listener(message: ConsumedMessage, context: OrderlyContext) -> ConsumeOrderlyStatus:
        attempts.add((_key_seq(message)[1], context.attempt))
        if _key_seq(message)[1] == 2:
            context.suspend_s = 0.05
            raise RuntimeError("poison")
        calls.add(_key_seq(message)[1])
        return SUCCESS

    consumer = OrderlyConsumer(
        kafka_bootstrap, group, topic, listener, max_reconsume=3, namespace=namespace, extra_config=FAST_GROUP
    )
    with consumer:
        calls.wait_until(lambda items: len(items) >= 4)
        assert wait_committed(kafka_bootstrap, group, topic, 1) == end_offsets(kafka_bootstrap, topic, 1)

    assert calls.snapshot() == [0, 1, 3, 4]
    assert [a for seq, a in attempts.snapshot() if seq == 2] == [1, 2, 3, 4]  # 1 + max_reconsume
    dead = wait_for(kafka_bootstrap, Topics(namespace).dead_letter(group), 1)
    assert len(dead) == 1
    record = dead[0]
    assert (record.key, record.value) == (b"k", b"k:2")
    assert record.headers["trace"] == b"t-2"
    assert record.headers["txb.tags"] == b"TAGA"
    assert record.headers[H_ORIGIN] == f"{topic}/0/2".encode()
    assert record.headers[H_RETRY_COUNT] == b"3"
    assert b"failed 4 times" in record.headers[H_REASON]


def test_other_partitions_flow_while_one_is_suspended(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=2)
    by_name = lambda message, arg, count: 0 if message.key == b"A" else 1  # noqa: E731
    with OrderedProducer(kafka_bootstrap, selector=by_name) as producer:
        for seq in range(5):
            producer.send(topic, f"A:{seq}".encode(), key=b"A")
        for seq in range(40):
            producer.send(topic, f"B:{seq}".encode(), key=b"B")
    release = threading.Event()
    a0_attempts = Calls()

    def listener(message: ConsumedMessage, context: OrderlyContext) -> ConsumeOrderlyStatus:
        item = _key_seq(message)
        if item == ("A", 0) and not release.is_set():
            a0_attempts.add(context.attempt)
            context.suspend_s = 0.4
            return SUSPEND
        calls.add(item)
        return SUCCESS

    consumer = OrderlyConsumer(
        kafka_bootstrap, group_factory(), topic, listener, max_reconsume=None, extra_config=FAST_GROUP
    )
    with consumer:
        # A's head stays suspended for several rounds (over a second) ...
        a0_attempts.wait_until(lambda attempts: len(attempts) >= 4)
        during = calls.wait_until(lambda items: sum(k == "B" for k, _ in items) == 40)
        attempts_during = len(a0_attempts.snapshot())
        release.set()
        after = calls.wait_until(lambda items: len(items) == 45)

    # While A's head was suspended (and redelivered), all of B was processed and nothing of A.
    assert [seq for k, seq in during if k == "B"] == list(range(40))
    assert not [item for item in during if item[0] == "A"]
    assert attempts_during >= 4
    assert a0_attempts.snapshot() == list(range(1, len(a0_attempts.snapshot()) + 1))
    assert [seq for k, seq in after if k == "A"] == [0, 1, 2, 3, 4]


def test_tag_subscription_selects_exactly_and_commits_the_rest(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=1)
    group = group_factory()
    tags = ["TAGA", "TAGB", "TAGC", None, "TAGAA", "taga"]
    expected = []
    with OrderedProducer(kafka_bootstrap) as producer:
        for seq in range(30):
            tag = tags[seq % len(tags)]
            producer.send(topic, f"m:{seq}".encode(), key=b"m", tags=tag)
            if tag in ("TAGA", "TAGC"):
                expected.append((tag, seq))

    def listener(message: ConsumedMessage, _context: OrderlyContext) -> ConsumeOrderlyStatus:
        calls.add((message.tag, _key_seq(message)[1]))
        return SUCCESS

    consumer = OrderlyConsumer(
        kafka_bootstrap, group, topic, listener, subscription=" TAGA ||TAGC ", extra_config=FAST_GROUP
    )
    with consumer:
        calls.wait_until(lambda items: len(items) >= len(expected))
        committed = wait_committed(kafka_bootstrap, group, topic, 1)

    assert calls.snapshot() == expected
    assert committed == {0: 30}  # filtered ones count as processed


@pytest.mark.parametrize("expression", ["", "TAGA ||", "||", "TAGA | TAGB", "TAG A"])
def test_malformed_subscription_fails_at_subscribe_time(expression: str) -> None:
    with pytest.raises(ConfigurationError, match="subscription expression"):
        OrderlyConsumer("localhost:1", "g", "t", lambda m, c: SUCCESS, subscription=expression)


def _members_with_partitions(bootstrap: str, group: str) -> int:
    admin = kafka.admin(bootstrap)  # held: its futures never complete once it is collected
    described = admin.describe_consumer_groups([group])[group].result(10)
    return sum(1 for m in described.members if m.assignment and m.assignment.topic_partitions)


def test_rebalance_to_a_second_member_skips_nothing_and_keeps_key_order(
    kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str], calls: Calls
) -> None:
    topic = topic_factory(partitions=4)
    group = group_factory()
    keys = [f"key{i}" for i in range(8)]
    # Every partition carries keys, so whichever the second member gets, it has work.
    assert {select_partition(OrderedMessage(topic, b"", key=k.encode()), 4) for k in keys} == {0, 1, 2, 3}
    members: dict[str, set[str]] = {"first": set(), "second": set()}

    def send(seqs: range) -> None:
        with OrderedProducer(kafka_bootstrap) as producer:
            for seq in seqs:
                for key in keys:
                    producer.send(topic, f"{key}:{seq}".encode(), key=key.encode())

    def listener_of(name: str) -> Callable[[ConsumedMessage, OrderlyContext], ConsumeOrderlyStatus]:
        def listener(message: ConsumedMessage, _context: OrderlyContext) -> ConsumeOrderlyStatus:
            threading.Event().wait(0.01)  # some work, so the rebalance lands mid-stream
            calls.add(_key_seq(message))
            members[name].add(_key_seq(message)[0])
            return SUCCESS

        return listener

    send(range(40))
    first = OrderlyConsumer(kafka_bootstrap, group, topic, listener_of("first"), extra_config=FAST_GROUP)
    second = OrderlyConsumer(kafka_bootstrap, group, topic, listener_of("second"), extra_config=FAST_GROUP)
    with first:
        calls.wait_until(lambda items: len(items) >= 60)
        with second:
            # The first member alone may finish the backlog before the group rebalances, so the
            # rest is sent once both members hold partitions: the second then has work for sure.
            assert eventually(lambda: _members_with_partitions(kafka_bootstrap, group) == 2, timeout=30), (
                "the group never gave both members partitions"
            )
            send(range(40, 80))
            done = calls.wait_until(lambda items: set(items) >= {(k, s) for k in keys for s in range(80)})

    assert members["second"], "the second member never processed a message"
    for key in keys:
        firsts: list[int] = []
        for k, seq in done:
            if k == key and seq not in firsts:
                firsts.append(seq)
        assert firsts == list(range(80)), key  # nothing skipped, first-time processing in order
