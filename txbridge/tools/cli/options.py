"""What every ``txbridge`` subcommand shares: one-line errors, the Kafka address and the client
settings (``--bootstrap``, ``--command-config``, ``-X``).

The main group (:mod:`txbridge.tools.cli.main`) and each subcommand module import these; this
module imports none of them, so the CLI's modules form no cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from txbridge._command_line import BOOTSTRAP_ENV, one_line_errors
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
    "resolve_bootstrap",
]

F = TypeVar("F", bound=Callable[..., Any])


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


def resolve_bootstrap(
    bootstrap: str | None, *, start_local: bool = False, client: ClientConfig | None = None
) -> str:
    """The bootstrap to use: the given one, else the client file's ``bootstrap.servers``, else the
    local broker; checked with the client settings (a secured cluster is probed as one)."""
    from txbridge.kafka import check_reachable
    from txbridge.tools.local.broker import LocalKafka

    settings = client.librdkafka() if client is not None else None
    bootstrap = bootstrap or (client.bootstrap if client is not None else None)
    if bootstrap:
        check_reachable(bootstrap, extra=settings)
        return bootstrap
    broker = LocalKafka.from_home()
    status = broker.status()
    if not status.running:
        if not start_local:
            raise TxBridgeError(
                "no --bootstrap given and the local broker is not running: "
                "start it with 'txbridge kafka start' or pass --bootstrap"
            )
        click.echo(f"starting the local Kafka broker at {broker.bootstrap} ...", err=True)
        status = broker.start()
    check_reachable(status.bootstrap, extra=settings)
    return status.bootstrap
