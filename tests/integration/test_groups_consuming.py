"""``kafka.groups_consuming`` (a coordinator's check for another group serving its namespace)
describes only groups that may have members: a cluster keeps every group that ever committed an
offset, and describing each took 0.9-1.3 s per call with a thousand of them. The filter must not
hide a live group of either protocol: a KIP-848 group's states (assigning, reconciling) have no
name in the client and must still be described."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from txbridge import kafka
from txbridge.kafka import Consumer, TopicPartition

pytestmark = pytest.mark.integration


def _member(bootstrap: str, topic: str, protocol: str) -> Consumer:
    settings = {"group_protocol": protocol}
    if protocol == "classic":
        settings["session_timeout_ms"] = 6000
    consumer = kafka.consumer(
        bootstrap, f"live-{protocol}-{uuid.uuid4().hex[:6]}", client_id=f"m-{protocol}", **settings
    )
    consumer.subscribe([topic])
    return consumer


@pytest.fixture
def members(kafka_bootstrap: str, topic_factory: Callable[..., str]) -> Iterator[tuple[str, list[Consumer]]]:
    topic = topic_factory(partitions=2, prefix="consumed")
    made = [_member(kafka_bootstrap, topic, p) for p in ("classic", "consumer")]
    yield topic, made
    for consumer in made:
        consumer.close()


def test_live_groups_of_both_protocols_are_found_among_empty_ones(
    kafka_bootstrap: str, members: tuple[str, list[Consumer]]
) -> None:
    topic, consumers = members
    for _ in range(3):  # groups that once committed an offset of the topic and have no member
        committer = kafka.consumer(kafka_bootstrap, f"empty-{uuid.uuid4().hex[:6]}")
        committer.assign([TopicPartition(topic, 0, 0)])
        kafka.commit_offsets(committer, {(topic, 0): 0})
        committer.close()
    deadline = time.monotonic() + 60
    found: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.2)
        found = kafka.groups_consuming(kafka_bootstrap, [topic], timeout=10)
        if len(found) == 2:
            break

    assert sorted(found.values()) == [["m-classic"], ["m-consumer"]]
    assert all(group.startswith("live-") for group in found)
