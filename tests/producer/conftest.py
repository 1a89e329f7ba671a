"""Fixtures of the producer tests: a fresh txbridge namespace and started producers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txbridge import TransactionProducer, TxState
from txbridge.wire import Topics

PARTITIONS = 4
SECRET = b"test-secret-do-not-log"


@pytest.fixture
def namespace(namespace_factory: Callable[..., str]) -> str:
    """A txbridge namespace of its own (``txbridge init`` with 4 partitions), deleted at teardown."""
    return namespace_factory(PARTITIONS, prefix="txbns_")


@pytest.fixture
def topics(namespace: str) -> Topics:
    return Topics(namespace)


@pytest.fixture
def orders(topic_factory: Callable[..., str]) -> str:
    """A real topic to send to (the producer refuses a topic that does not exist)."""
    return topic_factory(prefix="orders")


@pytest.fixture
def payments(topic_factory: Callable[..., str]) -> str:
    """A second real topic."""
    return topic_factory(prefix="payments")


@pytest.fixture
def make_producer(
    kafka_bootstrap: str, namespace: str, group_factory: Callable[[], str]
) -> Iterator[Callable[..., TransactionProducer]]:
    """Build and start a producer (closed at teardown); keyword options override the defaults."""
    started: list[TransactionProducer] = []

    def make(**options: Any) -> TransactionProducer:
        options.setdefault("group", group_factory())
        options.setdefault("secret", SECRET)
        options.setdefault("namespace", namespace)
        options.setdefault("partitions", PARTITIONS)
        if "listener" not in options:
            options.setdefault("check", lambda txn: TxState.UNKNOWN)
        producer = TransactionProducer(kafka_bootstrap, options.pop("group"), **options)
        producer.start()
        started.append(producer)
        return producer

    yield make
    for producer in started:
        producer.close()
