"""Compacted topics that are read from their start roll small segments, so compaction keeps up.

A checkout's local broker keeps its data directory across runs; with Kafka's 100 MB segments
``__transaction_state`` was never compacted and every start replayed it (919 MB here after a
day's runs). New internal topics get :data:`INTERNAL_SEGMENT_BYTES`; existing ones are lowered
at start (``shrink_internal_segments``, with :func:`txbridge.kafka.lower_topic_setting`).
txbridge's own ``<ns>_state`` is read from its start by every takeover: ``txbridge init``
creates it with :data:`STATE_SEGMENT_BYTES` segments and lowers an existing one's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from servers.broker import INTERNAL_SEGMENT_BYTES, shrink_internal_segments
from txbridge import kafka
from txbridge.topics import STATE_SEGMENT_BYTES, init_topics
from txbridge.wire import Topics

pytestmark = pytest.mark.integration

_BIG = 100 * 1024 * 1024


def _setting(bootstrap: str, topic: str, name: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    client = kafka.admin(bootstrap)  # held until the answer: a dropped client cancels it
    return str(client.describe_configs([resource])[resource].result(timeout=10)[name].value)


@pytest.mark.skipif(
    bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")), reason="an external broker has its own settings"
)
def test_the_local_brokers_internal_topics_are_created_with_small_segments(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    producer = kafka.producer(kafka_bootstrap, transactional_id=f"segments-{uuid.uuid4().hex[:8]}")
    kafka.init_transactions(producer, 30)  # __transaction_state exists from here
    topic = topic_factory(partitions=1)
    consumer = kafka.consumer(kafka_bootstrap, f"segments-{uuid.uuid4().hex[:8]}")
    try:
        consumer.commit(offsets=[kafka.TopicPartition(topic, 0, 0)], asynchronous=False)  # __consumer_offsets
    finally:
        consumer.close()

    for internal in ("__transaction_state", "__consumer_offsets"):
        assert _setting(kafka_bootstrap, internal, "segment.bytes") == str(INTERNAL_SEGMENT_BYTES)
    assert shrink_internal_segments(kafka_bootstrap) == []  # nothing larger to lower


def test_lower_topic_setting_lowers_only_larger_values_and_keeps_the_others(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    big = topic_factory(config={"segment.bytes": str(_BIG), "cleanup.policy": "compact"})
    small = topic_factory(config={"segment.bytes": str(2 * 1024 * 1024)})
    missing = f"never-created-{uuid.uuid4().hex[:8]}"

    changed = kafka.lower_topic_setting(
        kafka_bootstrap, [big, small, missing], "segment.bytes", 8 * 1024 * 1024
    )

    assert changed == [big]
    assert _setting(kafka_bootstrap, big, "segment.bytes") == str(8 * 1024 * 1024)
    assert _setting(kafka_bootstrap, big, "cleanup.policy") == "compact"  # an incremental change
    assert _setting(kafka_bootstrap, small, "segment.bytes") == str(2 * 1024 * 1024)
    assert missing not in kafka.admin(kafka_bootstrap).list_topics(timeout=10).topics


def test_init_gives_the_state_topic_small_segments_and_lowers_an_older_namespaces(
    kafka_bootstrap: str,
) -> None:
    fresh, older = (f"__txb_segments_{uuid.uuid4().hex[:8]}" for _ in range(2))
    # A namespace an older txbridge made: <ns>_state with the broker's segments.
    kafka.ensure_topics(
        kafka_bootstrap,
        [kafka.TopicSpec(Topics(older).state, 2, {"cleanup.policy": "compact", "segment.bytes": str(_BIG)})],
    )

    created = init_topics(kafka_bootstrap, fresh, partitions=2)
    upgraded = init_topics(kafka_bootstrap, older, partitions=2)
    again = init_topics(kafka_bootstrap, older, partitions=2)

    assert created[Topics(fresh).state] == "created"
    assert upgraded[Topics(older).state] == "updated"
    assert again[Topics(older).state] == "exists"
    for namespace in (fresh, older):
        state = Topics(namespace).state
        assert _setting(kafka_bootstrap, state, "segment.bytes") == str(STATE_SEGMENT_BYTES)
        assert _setting(kafka_bootstrap, state, "cleanup.policy") == "compact"
