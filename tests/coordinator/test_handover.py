"""A static member's clean stop hands its partitions over at once, and its restart under the
same instance id gets its share back (coordinator/group/membership.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from tests.coordinator.conftest import PARTITIONS, Env, RunningCoordinator, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def _members(env: Env, group: str) -> dict[str | None, int]:
    """Each member's ``group.instance.id`` and how many half partitions it is assigned."""
    admin = kafka.admin(env.bootstrap)
    described = admin.describe_consumer_groups([group])[group].result(10)
    members = {}
    for m in described.members:
        assigned = m.assignment.topic_partitions if m.assignment else []
        members[m.group_instance_id] = sum(tp.topic == env.topics.half for tp in assigned)
    return members


def _owned(*handles: RunningCoordinator) -> list[int]:
    return [len(h.service.partitions) for h in handles]


def _commit(env: Env, topic: str, label: str, count: int = 6) -> set[str]:
    return {
        env.producer.transaction([Msg(topic, f"{label}-{i}".encode(), key=f"k{i}".encode())], TxState.COMMIT)
        for i in range(count)
    }


def test_a_clean_stop_hands_the_partitions_over_and_a_restart_gets_its_share(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    name = f"a-{uuid.uuid4().hex[:6]}"
    first = env.start(instance_id=name)
    second = env.start(instance_id=f"b-{uuid.uuid4().hex[:6]}")
    group = first.service.config.group_id
    assert eventually(lambda: sorted(_owned(first, second)) == [1, 2]), _owned(first, second)
    txs = _commit(env, topic, "before")
    wait_for(env.bootstrap, topic, len(txs))

    first.stop()
    # The other member has every partition while the stopped one is still a member of the
    # group: they moved by the hand-over, not when its session expired.
    assert eventually(lambda: _owned(second) == [PARTITIONS], timeout=10), _owned(second)
    assert _members(env, group).get(name) == 0, _members(env, group)
    assert first.service.stats["handovers"] == 1
    if second.service.config.group_protocol == "classic":
        # The partition it had before, given back by the hand-over's eager rebalance, was served
        # on from memory: no claim, no restore.
        assert second.service.stats["partitions_kept"] >= 1
    else:  # the consumer protocol moves only the handed-over partitions: its own one stayed
        assert second.service.stats["owners_fenced"] == PARTITIONS
    txs |= _commit(env, topic, "handed")

    # A restart under the same instance id waits for that member to leave, then gets a share:
    # joining at once, it would take the member's empty assignment and idle.
    again = env.start(instance_id=name)
    assert eventually(lambda: sorted(_owned(again, second)) == [1, 2]), _owned(again, second)
    txs |= _commit(env, topic, "after")

    seen = wait_for(env.bootstrap, topic, len(txs))
    assert len(seen) >= len(txs)
    published = sorted(s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic))
    assert published == sorted(txs), "each committed transaction published exactly once"


def test_a_lone_static_member_keeps_its_partitions_for_its_restart(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """With nobody to take them, a clean stop hands nothing over: the restart under the same
    instance id gets its partitions back at once, as a static member's should."""
    topic = topic_factory(partitions=PARTITIONS)
    name = f"a-{uuid.uuid4().hex[:6]}"
    first = env.start(instance_id=name)
    txs = _commit(env, topic, "before")
    wait_for(env.bootstrap, topic, len(txs))
    first.stop()
    assert first.service.stats["handovers"] == 0
    assert _members(env, first.service.config.group_id) == {name: PARTITIONS}

    again = env.start(instance_id=name)
    assert _owned(again) == [PARTITIONS]
    txs |= _commit(env, topic, "after")
    wait_for(env.bootstrap, topic, len(txs))
    published = sorted(s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic))
    assert published == sorted(txs)
