"""The options every command line shares, the ``txbridge`` command's subcommands and
``python -m coordinator``: one-line errors, the Kafka address and the client settings
(``--bootstrap``, ``--command-config``, ``-X``).

They sit in the SDK because every layer that has commands (the coordinator, the console, the
local servers, the bench, the pipelines) declares them, and no layer imports the ``cli`` package
above it; they need only click, which the SDK depends on for the ``txbridge`` command anyway.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from txbridge.client_config import COMMAND_CONFIG_ENV
from txbridge.errors import TxBridgeError

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

__all__ = [
    "BOOTSTRAP_ENV",
    "bootstrap_option",
    "client_config_flags",
    "client_options",
    "load_client_config",
    "one_line_errors",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Where every command looks for the Kafka bootstrap servers when ``--bootstrap`` is not given.
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def one_line_errors(func: F) -> F:
    """Turn a TxBridgeError into ``error: <message>`` and exit code 2, no traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TxBridgeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def bootstrap_option(func: F) -> F:
    return click.option(
        "--bootstrap",
        envvar=BOOTSTRAP_ENV,
        default=None,
        help=f"Kafka bootstrap servers (env {BOOTSTRAP_ENV}); default: the local broker.",
    )(func)


def client_config_flags(*, x_aliases: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Add ``--command-config FILE`` (env ``TXBRIDGE_COMMAND_CONFIG``) and repeatable ``-X KEY=VALUE``.

    The command receives them as ``command_config`` and ``client_overrides``; most commands
    want :func:`client_options`, which turns them into one ``client`` argument.

    Args:
        x_aliases: further names of ``-X`` (the coordinator's ``--kafka-config``).
    """

    def decorate(func: F) -> F:
        func = click.option(
            "-X",
            *x_aliases,
            "client_overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="A Kafka client setting on top of --command-config (repeatable; Java or librdkafka name).",
        )(func)
        return click.option(
            "--command-config",
            "command_config",
            envvar=COMMAND_CONFIG_ENV,
            type=click.Path(dir_okay=False),
            default=None,
            help=(
                "Kafka client properties file, as the Kafka CLIs take it: security.protocol, sasl.*, ssl.* "
                f"(env {COMMAND_CONFIG_ENV})."
            ),
        )(func)

    return decorate


def client_options(func: F) -> F:
    """:func:`client_config_flags`, given to the command as ``client``: a checked ClientConfig.

    A bad file or setting is a one-line error before the command runs.
    """

    @wraps(func)
    def wrapper(
        *args: Any, command_config: str | None, client_overrides: tuple[str, ...], **kwargs: Any
    ) -> Any:
        kwargs["client"] = one_line_errors(load_client_config)(command_config, client_overrides)
        return func(*args, **kwargs)

    return cast(F, client_config_flags()(wrapper))


def load_client_config(command_config: str | None, overrides: tuple[str, ...] = ()) -> ClientConfig:
    """The client configuration of ``--command-config`` and ``-X``, checked for librdkafka.

    Raises:
        ConfigurationError: the file, a setting or a value is wrong; the message names it.
    """
    from txbridge.client_config import ClientConfig

    client = ClientConfig.load(command_config, overrides)
    client.librdkafka()  # every command uses librdkafka: a setting it cannot take fails here
    return client
