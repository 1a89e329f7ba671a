"""A message the coordinator could not republish is refused before its half record is written.

Its topic or partition does not exist, or it is above ``max_message_bytes``: once
committed the coordinator could only quarantine it, so both producers raise
before anything reaches ``<ns>_half`` and before the local transaction runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig, Secrets
from coordinator.service import Coordinator
from tests.kafka_helpers import read_topic, wait_for
from txbridge import AsyncTransactionProducer, LocalTransaction, Message, TransactionProducer, TxState, kafka
from txbridge.errors import KafkaOperationError, MessageTooLargeError, UnknownTopicError
from txbridge.producer.runtime import runtime_of
from txbridge.wire import Topics

from .conftest import PARTITIONS, SECRET

pytestmark = pytest.mark.integration

LIMIT = 1000
KEY = b"k-1"
HEADERS = [("trace", b"abc")]
# What the coordinator counts beside the value of such a message once republished: the key (3),
# the user header "trace"/"abc" (8), its "txb.tx" header with a 36-character tx id (6 + 36)
# and the per-record overhead (64).
BESIDE_VALUE = 3 + 8 + 6 + 36 + 64


def sized(topic: str, size: int) -> Message:
    """A message of ``size`` bytes as the coordinator measures it republished."""
    return Message(topic, b"x" * (size - BESIDE_VALUE), key=KEY, headers=HEADERS)


class Blocking:
    """The blocking producer behind the calls the tests make."""

    def __init__(self, producer: TransactionProducer) -> None:
        self.producer = producer

    def send(self, message: Message, execute: Callable[[LocalTransaction, Any], Any]) -> Any:
        return self.producer.send_in_transaction(message, execute)

    def block(self, messages: Sequence[Message], tx_ids: list[str]) -> None:
        with self.producer.transaction() as tx:
            tx_ids.append(tx.tx_id)
            for message in messages:
                tx.send(message)

    def close(self) -> None:
        self.producer.close()


class Async:
    """The asyncio producer behind the same calls, on one event loop."""

    def __init__(self, producer: AsyncTransactionProducer) -> None:
        self.producer = producer
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(producer.start())

    def send(self, message: Message, execute: Callable[[LocalTransaction, Any], Any]) -> Any:
        return self.loop.run_until_complete(self.producer.send_in_transaction(message, execute))

    def block(self, messages: Sequence[Message], tx_ids: list[str]) -> None:
        async def run() -> None:
            async with self.producer.transaction() as tx:
                tx_ids.append(tx.tx_id)
                for message in messages:
                    await tx.send(message)

        self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.producer.close())
        self.loop.close()


Sender = Blocking | Async


@pytest.fixture(params=["blocking", "asyncio"])
def make_sender(
    request: pytest.FixtureRequest, kafka_bootstrap: str, namespace: str, group_factory: Callable[[], str]
) -> Iterator[Callable[..., Sender]]:
    """A started producer of each kind (closed at teardown); keyword options are the producer's."""
    made: list[Sender] = []

    def make(**options: Any) -> Sender:
        options = {"secret": SECRET, "namespace": namespace, "partitions": PARTITIONS, **options}
        options.setdefault("check", lambda txn: TxState.UNKNOWN)
        sender: Sender
        if request.param == "blocking":
            producer = TransactionProducer(kafka_bootstrap, group_factory(), **options)
            producer.start()
            sender = Blocking(producer)
        else:
            sender = Async(AsyncTransactionProducer(kafka_bootstrap, group_factory(), **options))
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.close()


class Runs:
    """``execute`` callbacks that record the transactions they ran for."""

    def __init__(self) -> None:
        self.tx_ids: list[str] = []

    def commit(self, txn: LocalTransaction, arg: Any) -> TxState:
        self.tx_ids.append(txn.tx_id)
        return TxState.COMMIT


def cluster_topics(bootstrap: str) -> set[str]:
    # Every topic: asking for one by name would create it on a broker with auto.create.topics.enable.
    return set(kafka.admin(bootstrap).list_topics(timeout=10).topics)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create ``name`` and wait until the broker's metadata shows it with leaders."""
    kafka.ensure_topics(bootstrap, [kafka.TopicSpec(name, partitions)])
    admin, deadline = kafka.admin(bootstrap), time.monotonic() + 30
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=10).topics.get(name)
        if found is not None and found.error is None:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {name} was not in the metadata within 30s")


def test_a_missing_topic_is_refused_until_it_is_created(
    kafka_bootstrap: str,
    topics: Topics,
    make_sender: Callable[..., Sender],
    unique_name: Callable[[str], str],
) -> None:
    sender = make_sender()
    topic = unique_name("TopicTest")
    runs = Runs()

    with pytest.raises(UnknownTopicError, match=f"does not exist at .*: create topic {topic}") as refused:
        sender.send(Message(topic, b"v", key=KEY), runs.commit)

    assert refused.value.topic == topic
    assert runs.tx_ids == []
    assert read_topic(kafka_bootstrap, topics.half) == []
    assert read_topic(kafka_bootstrap, topics.op) == []
    assert topic not in cluster_topics(kafka_bootstrap)  # the check created nothing (the broker auto-creates)

    create_topic(kafka_bootstrap, topic, 2)  # no producer restart: the next send lists topics again
    result = sender.send(Message(topic, b"v", key=KEY), runs.commit)

    assert result.state is TxState.COMMIT
    assert result.op_acknowledged
    assert runs.tx_ids == [result.tx_id]
    halves = read_topic(kafka_bootstrap, topics.half)
    assert [(h.key, h.headers["txb.topic"]) for h in halves] == [(result.tx_id.encode(), topic.encode())]


def test_a_partition_the_topic_does_not_have_is_refused(
    kafka_bootstrap: str,
    topics: Topics,
    make_sender: Callable[..., Sender],
    topic_factory: Callable[..., str],
) -> None:
    sender = make_sender()
    topic = topic_factory(partitions=2)
    runs = Runs()

    with pytest.raises(
        UnknownTopicError, match=f"has no partition 2 \\(it has 2\\).*partitions to topic {topic}"
    ):
        sender.send(Message(topic, b"v", key=KEY, partition=2), runs.commit)
    assert runs.tx_ids == []
    assert read_topic(kafka_bootstrap, topics.half) == []

    result = sender.send(Message(topic, b"v", key=KEY, partition=1), runs.commit)
    assert result.state is TxState.COMMIT
    assert [h.headers["txb.partition"] for h in read_topic(kafka_bootstrap, topics.half)] == [b"1"]


def test_one_byte_over_max_message_bytes_is_refused_and_one_at_it_goes_through(
    kafka_bootstrap: str,
    topics: Topics,
    make_sender: Callable[..., Sender],
    topic_factory: Callable[..., str],
) -> None:
    sender = make_sender(max_message_bytes=LIMIT)
    topic = topic_factory()
    runs = Runs()

    with pytest.raises(MessageTooLargeError) as refused:
        sender.send(sized(topic, LIMIT + 1), runs.commit)
    assert f"is {LIMIT + 1} bytes" in str(refused.value)
    assert "raise max_message_bytes on the coordinator and the producer, or send a smaller message" in str(
        refused.value
    )
    assert runs.tx_ids == []
    assert read_topic(kafka_bootstrap, topics.half) == []

    result = sender.send(sized(topic, LIMIT), runs.commit)
    assert result.state is TxState.COMMIT
    assert runs.tx_ids == [result.tx_id]
    assert [h.key for h in read_topic(kafka_bootstrap, topics.half)] == [result.tx_id.encode()]


def test_a_refused_message_in_a_block_rolls_back_what_was_sent(
    kafka_bootstrap: str,
    topics: Topics,
    make_sender: Callable[..., Sender],
    orders: str,
    unique_name: Callable[[str], str],
) -> None:
    sender = make_sender()
    missing = unique_name("missing")
    tx_ids: list[str] = []

    with pytest.raises(UnknownTopicError, match=f"create topic {missing}"):
        sender.block([Message(orders, b"a", key=KEY), Message(missing, b"b", key=KEY)], tx_ids)

    [tx_id] = tx_ids
    halves = [h for h in read_topic(kafka_bootstrap, topics.half) if h.key == tx_id.encode()]
    assert [h.headers["txb.topic"] for h in halves] == [orders.encode()]  # the refused one was not written
    ops = [o for o in read_topic(kafka_bootstrap, topics.op) if o.key == tx_id.encode()]
    assert [b'"state":"ROLLBACK"' in (o.value or b"") for o in ops] == [True]


@pytest.fixture
def coordinator_at_limit(kafka_bootstrap: str, namespace: str) -> Iterator[None]:
    """A coordinator of the namespace whose ``max_message_bytes`` is :data:`LIMIT`."""
    config = CoordinatorConfig(
        bootstrap=kafka_bootstrap,
        namespace=namespace,
        group_id=f"coord-{namespace}",
        max_message_bytes=LIMIT,
        secrets=Secrets(default=SECRET.decode()),
    )
    service = Coordinator(config)
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    assert service.running.wait(60), "the coordinator got no partitions within 60s"
    yield
    service.stop()
    thread.join(60)


def test_the_coordinator_publishes_a_message_at_the_limit_the_producer_let_through(
    kafka_bootstrap: str,
    topics: Topics,
    coordinator_at_limit: None,
    make_producer: Callable[..., TransactionProducer],
    topic_factory: Callable[..., str],
) -> None:
    producer = make_producer(max_message_bytes=LIMIT)
    topic = topic_factory()

    result = producer.send_in_transaction(sized(topic, LIMIT), lambda txn, arg: TxState.COMMIT)

    assert result.state is TxState.COMMIT
    [published] = wait_for(kafka_bootstrap, topic, 1)
    assert len(published.value or b"") == LIMIT - BESIDE_VALUE
    assert read_topic(kafka_bootstrap, topics.quarantine) == []


def test_when_topic_metadata_cannot_be_read_known_topics_go_on_and_others_raise(
    kafka_bootstrap: str,
    topics: Topics,
    make_producer: Callable[..., TransactionProducer],
    *,
    orders: str,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = make_producer()
    runtime = runtime_of(producer)
    runtime.catalog.ttl_s = 0.0  # from the next listing on, every send lists the topics again
    runtime.catalog.update(runtime.pump.list_topics(timeout=10), listed_at=time.monotonic())

    def unreadable(timeout: float) -> dict[str, int | None]:
        raise KafkaOperationError("reading topic metadata: Local: Timed out (_TIMED_OUT)", retriable=True)

    monkeypatch.setattr(runtime.pump, "list_topics", unreadable)

    result = producer.send_in_transaction(Message(orders, b"v"), lambda txn, arg: TxState.COMMIT)
    assert result.state is TxState.COMMIT  # the last listing showed it
    assert "keeping the last listing" in caplog.text
    with pytest.raises(KafkaOperationError, match="Timed out"):
        producer.send_in_transaction(Message(unique_name("missing"), b"v"), lambda txn, arg: TxState.COMMIT)
    assert [h.key for h in read_topic(kafka_bootstrap, topics.half)] == [result.tx_id.encode()]
