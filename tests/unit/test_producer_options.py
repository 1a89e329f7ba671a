"""One option set for both producers: ProducerOptions, its docs, and what each constructor takes.

The constructors do no I/O, so nothing here needs a broker.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest

import txbridge
from txbridge import (
    AsyncTransactionProducer,
    BytesSerializer,
    ProducerOptions,
    StringSerializer,
    TransactionProducer,
    TxState,
)
from txbridge.client_config import ClientConfig
from txbridge.errors import ConfigurationError
from txbridge.limits import DEFAULT_MAX_MESSAGE_BYTES
from txbridge.producer.settings import OPTION_NAMES, ProducerSettings
from txbridge.wire import DEFAULT_NAMESPACE

PRODUCERS = [TransactionProducer, AsyncTransactionProducer]
Producer = TransactionProducer | AsyncTransactionProducer
SECRET = b"test-secret-do-not-log"


def check(txn: object) -> TxState:
    return TxState.UNKNOWN


#: A value for every option (listener is the alternative to check: exercised on its own below).
EVERY_OPTION: dict[str, Any] = {
    "secret": SECRET,
    "check": check,
    "namespace": "__tx_opts",
    "partitions": 6,
    "instance_id": "host-1",
    "check_host": "0.0.0.0",
    "check_port": 18080,
    "serve_checks": False,
    "advertised_url": "http://host-1:18080/txbridge/check",
    "value_serializer": StringSerializer(),
    "key_serializer": StringSerializer(),
    "heartbeat_interval_s": 2.0,
    "max_message_bytes": 2_000_000,
    "settle_unknown": True,
    "check_source": "orders-db",
    "client_config": ClientConfig.coerce({"security.protocol": "PLAINTEXT"}),
    "extra_config": {"linger.ms": 1},
}


def test_every_option_is_named_here_and_nothing_else() -> None:
    assert set(EVERY_OPTION) | {"listener"} == OPTION_NAMES


def test_secret_is_the_one_required_option() -> None:
    # What mypy reads (at run time, Python 3.11 cannot see Required under postponed annotations).
    hints = typing.get_type_hints(ProducerOptions, include_extras=True)

    assert hints["secret"] == typing.Required[bytes | str]
    assert [name for name, hint in hints.items() if typing.get_origin(hint) is typing.Required] == ["secret"]


def test_the_option_set_is_public() -> None:
    assert "ProducerOptions" in txbridge.__all__
    assert txbridge.ProducerOptions is ProducerOptions


@pytest.mark.parametrize("producer", PRODUCERS)
def test_both_constructors_take_bootstrap_group_and_the_typed_options(producer: type[Producer]) -> None:
    parameters = list(inspect.signature(producer.__init__).parameters.values())

    assert [(p.name, p.kind) for p in parameters] == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("bootstrap", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("group", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("options", inspect.Parameter.VAR_KEYWORD),
    ]
    hints = typing.get_type_hints(producer.__init__, include_extras=True)
    assert hints["options"] == typing.Unpack[ProducerOptions]


@pytest.mark.parametrize("producer", PRODUCERS)
def test_both_constructors_accept_every_option(producer: type[Producer]) -> None:
    made = producer("127.0.0.1:1", "orders", **EVERY_OPTION)

    settings = made.settings
    assert (settings.namespace, settings.partitions, settings.instance_id) == ("__tx_opts", 6, "host-1")
    assert (settings.check_host, settings.check_port, settings.serve_checks) == ("0.0.0.0", 18080, False)
    assert made.check_url == "http://host-1:18080/txbridge/check"
    assert settings.heartbeat_interval_s == 2.0
    assert settings.max_message_bytes == 2_000_000
    assert settings.extra_config["security.protocol"] == "PLAINTEXT"
    assert settings.extra_config["linger.ms"] == 1
    assert made.check is check
    assert made.settles_unknown


@pytest.mark.parametrize("producer", PRODUCERS)
def test_both_constructors_take_a_listener_instead_of_a_check(producer: type[Producer]) -> None:
    class Listener(txbridge.TransactionListener):
        def execute_local_transaction(self, txn: txbridge.LocalTransaction, arg: Any) -> TxState:
            return TxState.COMMIT

        def check_local_transaction(self, txn: txbridge.LocalTransaction) -> TxState:
            return TxState.ROLLBACK

    listener = Listener()
    made = producer("127.0.0.1:1", "orders", secret=SECRET, listener=listener)

    assert made.listener is listener
    assert made.check == listener.check_local_transaction


@pytest.mark.parametrize("producer", PRODUCERS)
def test_both_producers_get_the_same_defaults(producer: type[Producer]) -> None:
    settings = producer("127.0.0.1:1", "orders", secret=SECRET, check=check).settings

    assert (settings.namespace, settings.partitions) == (DEFAULT_NAMESPACE, None)  # partitions: read at start
    assert (settings.check_host, settings.check_port, settings.serve_checks) == ("127.0.0.1", 0, True)
    assert settings.advertised_url is None
    assert settings.instance_id  # host-pid-random
    assert isinstance(settings.value_serializer, BytesSerializer)
    assert isinstance(settings.key_serializer, BytesSerializer)
    assert settings.heartbeat_interval_s == 1.0
    assert settings.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    assert settings.settle_unknown is None
    assert settings.extra_config == {}


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize(
    ("misspelt", "meant"),
    [("namspace", "namespace"), ("check_timeout_s", None), ("heartbeat_interval", "heartbeat_interval_s")],
)
def test_a_misspelt_option_fails_fast_naming_it(
    producer: type[Producer], misspelt: str, meant: str | None
) -> None:
    with pytest.raises(
        TypeError, match=rf"{producer.__name__}\(\) got an unexpected keyword argument '{misspelt}'"
    ) as raised:
        producer("127.0.0.1:1", "orders", secret=SECRET, check=check, **{misspelt: "x"})

    message = str(raised.value)
    assert "txbridge.ProducerOptions" in message
    if meant is not None:
        assert f"did you mean '{meant}'?" in message


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"check": check}, "secret is required"),
        ({"secret": SECRET}, "listener= .* or check="),
        ({"secret": SECRET, "check": check, "serve_checks": False}, "advertised_url"),
    ],
)
def test_both_constructors_raise_the_same_configuration_errors(
    producer: type[Producer], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        producer("127.0.0.1:1", "orders", **options)


def test_the_options_are_the_settings_plus_how_to_answer_checks_and_the_client_config() -> None:
    settings = {f.name for f in dataclasses.fields(ProducerSettings)} - {"bootstrap", "group"}

    assert settings | {"listener", "check", "client_config"} == OPTION_NAMES


def test_every_option_is_documented_once_in_producer_options() -> None:
    doc = inspect.getdoc(ProducerOptions) or ""
    attributes = doc.split("Attributes:", 1)[1]

    for name in OPTION_NAMES:
        assert f"\n    {name}: " in attributes, name
    for producer in PRODUCERS:
        assert "ProducerOptions" in (inspect.getdoc(producer) or "")
