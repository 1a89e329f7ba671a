"""Helpers for the consumer tests: a thread-safe record of listener calls, committed offsets."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from txbridge import kafka

#: Fast group settings so tests do not wait on the broker's defaults.
FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


@dataclass
class Calls:
    """Every listener call, in the order they happened."""

    items: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.items)

    def wait_until(self, predicate: Callable[[list[Any]], bool], timeout: float = 60.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = self.snapshot()
            if predicate(items):
                return items
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout}s; calls so far: {self.snapshot()[-20:]}")


@pytest.fixture
def calls() -> Calls:
    return Calls()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (-1001 when none)."""
    consumer = kafka.consumer(bootstrap, group)
    try:
        found = consumer.committed(
            kafka.topic_partitions([(topic, p) for p in range(partitions)]), timeout=10
        )
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = kafka.consumer(bootstrap, f"probe-{uuid.uuid4().hex[:8]}")
    try:
        ends = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(kafka.topic_partitions([(topic, p)])[0], timeout=10)
            ends[p] = high
        return ends
    finally:
        consumer.close()


def wait_committed(
    bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 30.0
) -> dict[int, int]:
    """Wait until the group's committed offsets reach the end of every partition."""
    ends = end_offsets(bootstrap, topic, partitions)
    deadline = time.monotonic() + timeout
    while True:
        got = committed_offsets(bootstrap, group, topic, partitions)
        if got == ends or time.monotonic() > deadline:
            return got
        time.sleep(0.3)
