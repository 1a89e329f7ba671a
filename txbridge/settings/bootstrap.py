"""Which Kafka a command talks to: its bootstrap servers, resolved in one place for every command.

The sources, first found wins:

1. ``--bootstrap``, else the environment variable :data:`BOOTSTRAP_ENV` (click reads both);
2. what the command's own settings name: the coordinator's ``TXBRIDGE_BOOTSTRAP`` and the
   ``bootstrap`` of its ``--config`` TOML file;
3. ``bootstrap.servers`` of the client properties (``--command-config`` or the TOML's
   ``client_config``);
4. the process's :class:`LocalBroker`, if its entry point has one: the ``txbridge`` command
   finds (or, for ``smoke``, ``demo`` and ``bench``, starts) the local broker; ``python -m
   coordinator`` has none and says what to pass.

The address found is probed with the client settings before the command goes on, so a wrong
address or a secured cluster asked in plaintext fails at once, with the address in the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import click

from txbridge.errors import ConfigurationError
from txbridge.settings.options import BOOTSTRAP_ENV

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

__all__ = ["LocalBroker", "LocalBrokerFallback", "resolve_bootstrap"]


class LocalBroker(Protocol):
    """The local broker's bootstrap servers; started first when ``start`` is true.

    Raises:
        TxBridgeError: it does not run and ``start`` is false; the message says how to start it.
    """

    def __call__(self, *, start: bool) -> str: ...


@dataclass(frozen=True)
class LocalBrokerFallback:
    """The last source of the bootstrap servers, set by an entry point as its click ``obj``.

    The ``txbridge`` command sets it, so that each of its subcommands (those of every layer) falls
    back on the local broker; the layers below the command never import the local servers.
    """

    local_broker: LocalBroker


def resolve_bootstrap(
    bootstrap: str | None,
    *,
    client: ClientConfig | None = None,
    start_local: bool = False,
    sources: str = f"pass --bootstrap, set {BOOTSTRAP_ENV}, or name it in --command-config",
) -> str:
    """The bootstrap servers to use, from the sources in the order of this module; checked with
    the client settings.

    Args:
        bootstrap: what the command's own sources gave (flag, environment, its settings file);
            None or empty when none did.
        client: the client settings: their ``bootstrap.servers`` comes next, and the probe
            connects with them.
        start_local: start the local broker when it is the fallback and does not run.
        sources: the end of the message when nothing names the servers and there is no fallback.

    Raises:
        ConfigurationError: no source names the servers and the process has no local broker.
        TxBridgeError: the local broker does not run, or no broker answers at the address.
    """
    from txbridge.kafka import check_reachable

    bootstrap = bootstrap or (client.bootstrap if client is not None else None)
    if not bootstrap:
        fallback = _fallback()
        if fallback is None:
            raise ConfigurationError(f"no bootstrap given: {sources}")
        bootstrap = fallback.local_broker(start=start_local)
    check_reachable(bootstrap, extra=client.librdkafka() if client is not None else None)
    return bootstrap


def _fallback() -> LocalBrokerFallback | None:
    context = click.get_current_context(silent=True)
    return context.find_object(LocalBrokerFallback) if context is not None else None
