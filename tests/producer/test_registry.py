"""The producer registry as the coordinator sees it: heartbeats on ``<ns>_producers``, then a tombstone."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.kafka_helpers import read_topic
from txbridge import TransactionProducer, wire
from txbridge.wire import Topics

pytestmark = pytest.mark.integration


def test_heartbeats_then_tombstone(
    kafka_bootstrap: str, topics: Topics, make_producer: Callable[..., TransactionProducer]
) -> None:
    producer = make_producer(heartbeat_interval_s=60)
    key = f"{producer.settings.group}/{producer.instance_id}".encode()

    # The first heartbeat is acknowledged before start() returns.
    first = [r for r in read_topic(kafka_bootstrap, topics.producers) if r.key == key]
    assert len(first) == 1
    record = wire.decode_producer(first[0].value or b"")
    assert (record.group, record.instance, record.url) == (
        producer.settings.group,
        producer.instance_id,
        producer.check_url,
    )
    assert record.url.startswith("http://127.0.0.1:")
    assert record.url.endswith("/txbridge/check")
    producer.close()
    after = [r for r in read_topic(kafka_bootstrap, topics.producers) if r.key == key]
    assert [r.value is None for r in after] == [False, True]  # then the tombstone: this instance left


def test_heartbeats_repeat_every_interval(
    kafka_bootstrap: str, topics: Topics, make_producer: Callable[..., TransactionProducer]
) -> None:
    producer = make_producer(heartbeat_interval_s=0.3)
    key = f"{producer.settings.group}/{producer.instance_id}".encode()
    time.sleep(2.0)
    producer.close()
    beats = [r for r in read_topic(kafka_bootstrap, topics.producers) if r.key == key]
    assert len(beats) >= 4  # the first beat, then roughly one per 0.3 s (no upper bound asserted)
    assert beats[-1].value is None
    assert all(wire.decode_producer(r.value).url == producer.check_url for r in beats[:-1] if r.value)


def test_advertised_url_and_mounted_app(
    kafka_bootstrap: str, topics: Topics, make_producer: Callable[..., TransactionProducer]
) -> None:
    url = "http://orders-7.internal:8080/txbridge/check"
    producer = make_producer(
        serve_checks=False, advertised_url=url, instance_id="orders-7", heartbeat_interval_s=60
    )
    assert producer.check_url == url
    [beat] = [r for r in read_topic(kafka_bootstrap, topics.producers) if r.key.endswith(b"/orders-7")]
    assert wire.decode_producer(beat.value or b"").url == url
