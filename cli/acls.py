"""``txbridge acls``: print, and with ``--apply`` create, the least-privilege ACLs of one role.

The ACLs themselves are computed in :mod:`txbridge.acls`; this module is only the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from txbridge.acls import Role, apply_acls, render_commands, render_table, role_acls
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap
from txbridge.wire import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig


@click.command("acls")
@click.option(
    "--role", type=click.Choice([r.value for r in Role]), required=True, help="Whose ACLs to compute."
)
@click.option("--principal", required=True, help="Kafka principal of the role, e.g. User:orders-svc.")
@click.option(
    "--namespace",
    envvar="TXBRIDGE_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Internal topic prefix (env TXBRIDGE_NAMESPACE).",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    help="A real topic the transactions publish to (repeatable; NAME* for every topic starting with NAME).",
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    help=(
        "coordinator: its group_id (default txbridge-coordinator, or txbridge-coordinator.<namespace> "
        "for another namespace); consumer: its group (repeatable)."
    ),
)
@click.option(
    "--producers-may-not-write-real-topics",
    is_flag=True,
    help="producer, spark-sink: DESCRIBE the real topics only, so that only the coordinator publishes them.",
)
@click.option(
    "--plain-consumer",
    is_flag=True,
    help="consumer: leave out the retry and dead-letter topics of txbridge's own consumers.",
)
@click.option(
    "--apply",
    "apply_them",
    is_flag=True,
    help="Create them through the admin API, as a principal allowed to alter ACLs (its --command-config).",
)
@bootstrap_option
@client_options
@one_line_errors
def acls(
    *,
    role: str,
    principal: str,
    namespace: str,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    producers_may_not_write_real_topics: bool,
    plain_consumer: bool,
    apply_them: bool,
    bootstrap: str | None,
    client: ClientConfig,
) -> None:
    """Print the ACLs ROLE's principal needs (a table and kafka-acls.sh lines); --apply creates them."""
    computed = role_acls(
        role,
        principal,
        namespace=namespace,
        topics=topics,
        groups=groups,
        producers_may_write_real_topics=not producers_may_not_write_real_topics,
        plain_consumer=plain_consumer,
    )
    click.echo(f"# ACLs of the {role} role for {principal} (namespace {namespace})")
    click.echo(render_table(computed))
    click.echo("\n# the same with Kafka's CLI:")
    shown_config = str(client.file) if client.file is not None else None
    click.echo(render_commands(computed, bootstrap or client.bootstrap, shown_config))
    if not apply_them:
        return
    bootstrap = resolve_bootstrap(bootstrap, client=client)
    count = apply_acls(bootstrap, computed, client.librdkafka())
    click.echo(f"\ncreated {count} ACLs for {principal} at {bootstrap}")
