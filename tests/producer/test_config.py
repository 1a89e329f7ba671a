"""Misconfiguration fails fast, with a message that says what to change."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from servers.broker import free_port
from txbridge import Message, TransactionProducer, TxState
from txbridge.errors import ConfigurationError, KafkaUnavailableError, TransactionStateError
from txbridge.producer.runtime import runtime_of
from txbridge.wire import Topics, half_partition

from .conftest import PARTITIONS, SECRET


def check(txn: object) -> TxState:
    return TxState.UNKNOWN


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group": ""}, "group"),
        ({"secret": ""}, "secret is required"),
        ({"secret": None}, "secret is required"),
        ({"partitions": 0}, "partitions"),
        ({"check": None}, "listener= .* or check="),
        ({"serve_checks": False}, "advertised_url"),
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
        ({"group": "a/b"}, "must not contain '/'"),
        ({"max_message_bytes": 0}, "max_message_bytes must be a positive integer, the coordinator's"),
        ({"max_message_bytes": "1MB"}, "max_message_bytes"),
    ],
)
def test_constructor_rejects_bad_settings_without_io(kwargs: dict[str, object], message: str) -> None:
    options: dict[str, object] = {"group": "orders", "secret": SECRET, "check": check}
    options.update(kwargs)
    group = options.pop("group")
    with pytest.raises(ConfigurationError, match=message):
        TransactionProducer("127.0.0.1:1", group, **options)  # type: ignore[arg-type]


def test_not_started_producer_refuses_transactions() -> None:
    producer = TransactionProducer("127.0.0.1:1", "orders", secret=SECRET, check=check)
    with pytest.raises(TransactionStateError, match="start"):
        producer.send_in_transaction(__import__("txbridge").Message("t", b"v"), lambda t, a: TxState.COMMIT)


def test_unreachable_broker_fails_in_start() -> None:
    producer = TransactionProducer(f"127.0.0.1:{free_port()}", "orders", secret=SECRET, check=check)
    with pytest.raises(KafkaUnavailableError, match="bootstrap"):
        producer.start()


@pytest.mark.integration
def test_missing_topics_say_run_init(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    namespace = unique_name("nons").replace("-", "_")
    producer = TransactionProducer(kafka_bootstrap, "orders", secret=SECRET, check=check, namespace=namespace)
    with pytest.raises(ConfigurationError, match=r"txbridge init --namespace"):
        producer.start()


@pytest.mark.integration
def test_partition_mismatch_says_what_to_pass(kafka_bootstrap: str, namespace: str) -> None:
    producer = TransactionProducer(
        kafka_bootstrap, "orders", secret=SECRET, check=check, namespace=namespace, partitions=12
    )
    with pytest.raises(ConfigurationError, match=rf"pass partitions={PARTITIONS}, or leave partitions out"):
        producer.start()


@pytest.mark.integration
def test_without_partitions_the_producer_takes_the_half_topics_count(
    kafka_bootstrap: str, namespace: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    with TransactionProducer(kafka_bootstrap, "orders", secret=SECRET, check=check, namespace=namespace) as p:
        assert p.settings.partitions == PARTITIONS
        result = p.send_in_transaction(Message(topic, b"v", key=b"customer-7"), lambda _t, _a: TxState.COMMIT)
    assert result.partition == half_partition(b"customer-7", PARTITIONS)


@pytest.mark.integration
def test_a_partition_count_that_changes_under_a_running_producer_is_refused(
    kafka_bootstrap: str, namespace: str, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = topic_factory()
    with TransactionProducer(kafka_bootstrap, "orders", secret=SECRET, check=check, namespace=namespace) as p:
        p.send_in_transaction(Message(topic, b"v"), lambda _t, _a: TxState.COMMIT)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        grow = NewPartitions(Topics(namespace).half, PARTITIONS + 2)
        for future in admin.create_partitions([grow]).values():
            future.result(30)
        catalog = runtime_of(p).catalog
        refused: ConfigurationError | None = None
        deadline = time.monotonic() + 30  # until the new count reaches the producer's metadata
        while refused is None and time.monotonic() < deadline:
            monkeypatch.setattr(catalog, "_trusted_until", float("-inf"))  # the next send lists again
            try:
                p.send_in_transaction(Message(topic, b"v"), lambda _t, _a: TxState.COMMIT)
            except ConfigurationError as exc:
                refused = exc
            time.sleep(0.5)
    assert refused is not None
    assert "now has 6 partitions, not the 4 this producer started with" in str(refused)


@pytest.mark.integration
def test_busy_check_port_is_a_configuration_error(
    make_producer: Callable[..., TransactionProducer],
) -> None:
    first = make_producer()
    port = int(first.check_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ConfigurationError, match="check_port"):
        make_producer(check_port=port)


@pytest.mark.integration
def test_start_twice_and_close_twice(make_producer: Callable[..., TransactionProducer]) -> None:
    producer = make_producer()
    with pytest.raises(TransactionStateError):
        producer.start()
    producer.close()
    producer.close()
    with pytest.raises(TransactionStateError):
        producer.transaction()
