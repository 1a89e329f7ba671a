"""Misconfiguration fails fast, with a message that says what to change."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from txbridge import TransactionProducer, TxState
from txbridge.errors import ConfigurationError, KafkaUnavailableError, TransactionStateError
from txbridge.local.broker import free_port

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
    with pytest.raises(
        ConfigurationError, match=rf"pass partitions={PARTITIONS}.*txbridge init --partitions"
    ):
        producer.start()


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
