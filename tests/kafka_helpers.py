"""What a plain consumer sees on a topic: the yardstick of integration tests; and the tests' clean-up."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from txbridge import kafka
from txbridge.topics import internal_topics


@dataclass(frozen=True)
class Seen:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 30.0
) -> list[Seen]:
    """Every record of ``topic`` visible under ``isolation``, read to the end of each partition."""
    consumer = kafka.consumer(
        bootstrap,
        f"reader-{uuid.uuid4().hex[:8]}",
        isolation_level=isolation,
        enable_partition_eof=True,
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        seen: list[Seen] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} did not reach their end")
            for msg in consumer.consume(500, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(str(err))
                headers = {k: v for k, v in (msg.headers() or [])}
                seen.append(Seen(msg.partition(), msg.offset(), msg.key(), msg.value(), headers))
        return seen
    finally:
        consumer.close()


def wait_for(
    bootstrap: str, topic: str, count: int, *, timeout: float = 60.0, isolation: str = "read_committed"
) -> list[Seen]:
    """Re-read ``topic`` until at least ``count`` records are visible (or time runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = read_topic(bootstrap, topic, isolation=isolation)
        if len(seen) >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def delete_namespaces(
    bootstrap: str, namespaces: Iterable[str], *, extra: Mapping[str, Any] | None = None
) -> None:
    """Delete the internal topics of ``namespaces`` (what ``init_topics`` made); see :func:`delete_topics`."""
    names = [spec.name for namespace in namespaces for spec in internal_topics(namespace)]
    delete_topics(bootstrap, names, extra=extra)


def delete_topics(bootstrap: str, names: Iterable[str], *, extra: Mapping[str, Any] | None = None) -> None:
    """Delete ``names`` in one admin request.

    It waits only until the controller has taken the deletion (milliseconds on KRaft, 15 s at most),
    not until the brokers have removed the files. A topic already gone is fine.
    """
    names = list(names)
    if not names:
        return
    client = kafka.admin(bootstrap, extra)
    for future in client.delete_topics(names, operation_timeout=10, request_timeout=15).values():
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise


def eventually(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy (visibility waits, not performance)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
