"""``txbridge console``: serve the web console (:mod:`console`) for one cluster and its namespaces.

The console takes the cluster's settings as every subcommand does (``--bootstrap``,
``--command-config``, ``-X``), and its admin token from an environment variable or a file only,
never from the command line, where ``ps`` and shell histories would show it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from txbridge.errors import ConfigurationError
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap

if TYPE_CHECKING:
    from console import AdminToken
    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8480
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: The Host header values of a console on loopback (Starlette compares them without the port).
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _groups(pairs: tuple[str, ...]) -> dict[str, str]:
    groups = {}
    for pair in pairs:
        namespace, sep, group = pair.partition("=")
        if not sep or not namespace or not group:
            raise ConfigurationError(f"--group-id takes NAMESPACE=GROUP, not {pair!r}")
        groups[namespace] = group
    return groups


def coordinator_metrics(values: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``--coordinator-metrics`` values, ``[NAMESPACE=]PORT`` or ``[NAMESPACE=]URL``, by namespace
    (``""``: every namespace not named)."""
    found: dict[str, list[str]] = {}
    for value in values:
        namespace, sep, where = value.partition("=")
        if not sep or "://" in namespace:  # no namespace named (a URL's query may hold "=")
            namespace, where = "", value
        if not where:
            raise ConfigurationError(
                f"--coordinator-metrics takes [NAMESPACE=]PORT or [NAMESPACE=]URL, not {value!r}"
            )
        found.setdefault(namespace, []).append(where)
    return {namespace: tuple(where) for namespace, where in found.items()}


def admin_token(env_name: str | None, file: str | None) -> AdminToken | None:
    """The admin token from the variable ``env_name`` or from ``file`` (None: read-only).

    Raises:
        ConfigurationError: both are given, the variable is unset, or the file cannot be read,
            or the token is too short; the message says what to change and never holds the token.
    """
    from console import AdminToken

    if env_name and file:
        raise ConfigurationError("give --admin-token-env or --admin-token-file, not both")
    if env_name:
        value = os.environ.get(env_name, "")
        if not value.strip():
            raise ConfigurationError(
                f"--admin-token-env {env_name}: the variable {env_name} is unset or empty: "
                "set it to the token"
            )
        return AdminToken(value, f"${env_name}")
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"--admin-token-file {file}: cannot read it ({exc.strerror})") from None
        return AdminToken(value, file)
    return None


@click.command("console")
@bootstrap_option
@client_options
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="A namespace to serve (repeatable); default: every namespace on the cluster.",
)
@click.option(
    "--group-id",
    "group_ids",
    multiple=True,
    metavar="NAMESPACE=GROUP",
    help="The coordinators' group of a namespace whose coordinators run with --group-id (repeatable).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help=(
        "A host name the console answers to (repeatable; * for any). Default: the loopback names "
        "when listening on loopback, else any."
    ),
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--admin-token-env",
    metavar="NAME",
    default=None,
    help="The environment variable holding the admin token that actions need (without one: read-only).",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A file holding the admin token (instead of --admin-token-env).",
)
@click.option(
    "--producer-liveness",
    "liveness_s",
    default=10.0,
    show_default=True,
    help="Seconds a producer instance is live after its last heartbeat (coordinators' producer_liveness_s).",
)
@click.option(
    "--coordinator-metrics",
    "metrics",
    multiple=True,
    metavar="[NAMESPACE=]PORT|URL",
    help=(
        "Where the coordinators serve /metrics (repeatable): their metrics_port, scraped on each "
        "member of the coordinators' group, or a URL. Shows the producer groups' check latency and failures."
    ),
)
@one_line_errors
def console(
    *,
    bootstrap: str | None,
    client: ClientConfig,
    namespaces: tuple[str, ...],
    group_ids: tuple[str, ...],
    host: str,
    allowed_hosts: tuple[str, ...],
    port: int,
    admin_token_env: str | None,
    admin_token_file: str | None,
    liveness_s: float,
    metrics: tuple[str, ...],
) -> None:
    """Serve the web console: health, transactions, producer groups, and admin actions.

    Read-only unless started with an admin token (--admin-token-env NAME or --admin-token-file FILE).
    """
    import uvicorn

    from console import ConsoleSettings, build_app

    token = admin_token(admin_token_env, admin_token_file)
    settings = ConsoleSettings(
        bootstrap=resolve_bootstrap(bootstrap, client=client),
        client=client.librdkafka(),
        namespaces=namespaces,
        groups=_groups(group_ids),
        admin_token=token,
        liveness_s=liveness_s,
        allowed_hosts=allowed_hosts or (_LOOPBACK_NAMES if host in _LOOPBACK else ("*",)),
        coordinator_metrics=coordinator_metrics(metrics),
    )
    app = build_app(settings)
    mode = (
        "read-only (no admin token)"
        if token is None
        else f"actions enabled (admin token from {token.source})"
    )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"txbridge console for {settings.bootstrap} at http://{shown}:{port}/ ({mode})", err=True)
    if host not in _LOOPBACK:
        click.echo(
            "warning: listening beyond this host over plain HTTP; put it behind a TLS proxy so the "
            "admin token and session cookie are not sent in the clear",
            err=True,
        )
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, server_header=False)
