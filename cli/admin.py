"""``txbridge admin``: list and settle expired, quarantined and pending transactions.

What each subcommand does is in :mod:`txbridge.admin` (the functions it calls); this module is
only the command.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from txbridge.admin import list_expired, list_pending, list_quarantine, requeue, requeue_all, resolve
from txbridge.errors import TxBridgeError
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap
from txbridge.wire import DEFAULT_NAMESPACE, Topics, TxState

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig


@click.group("admin")
def admin() -> None:
    """Inspect and settle transactions the coordinator could not decide or republish."""


def _namespace_option(func: Any) -> Any:
    return click.option(
        "--namespace", envvar="TXBRIDGE_NAMESPACE", default=DEFAULT_NAMESPACE, show_default=True
    )(func)


def _bootstrap(bootstrap: str | None, client: ClientConfig) -> str:
    return resolve_bootstrap(bootstrap, client=client)


def _decorate(func: Any) -> Any:
    return bootstrap_option(client_options(_namespace_option(one_line_errors(func))))


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms > 0 else "?"


@admin.command("expired")
@_decorate
def expired_command(bootstrap: str | None, client: ClientConfig, namespace: str) -> None:
    """List expired transactions: tx id, group, checks, messages, status, topics, reason."""
    entries = list_expired(_bootstrap(bootstrap, client), namespace, client.librdkafka())
    if not entries:
        click.echo(f"no expired transactions in {Topics(namespace).expired}")
        return
    click.echo(f"{'tx id':36}  {'group':12}  {'checks':>6}  {'msgs':>4}  {'status':17}  topics / reason")
    for e in entries:
        topics = ",".join(e.topics)
        status = e.resolved.describe() if e.resolved is not None else "unresolved"
        click.echo(
            f"{e.tx_id:36}  {e.group:12}  {e.checks:>6}  {len(e.messages):>4}  {status:17}  "
            f"{topics} / {e.reason}"
        )


@admin.command("resolve")
@click.argument("tx_id")
@click.option("--commit", "decision", flag_value="COMMIT", help="Republish its messages.")
@click.option("--rollback", "decision", flag_value="ROLLBACK", help="Record the rollback.")
@_decorate
def resolve_command(
    bootstrap: str | None, client: ClientConfig, namespace: str, tx_id: str, decision: str | None
) -> None:
    """Resolve an expired transaction TX_ID with --commit or --rollback (once: a second is refused)."""
    if decision is None:
        raise click.UsageError("say --commit or --rollback")
    entry = resolve(_bootstrap(bootstrap, client), tx_id, TxState(decision), namespace, client.librdkafka())
    done = f"republished {len(entry.messages)} message(s)" if decision == "COMMIT" else "rollback recorded"
    click.echo(f"{tx_id}: {decision} by admin, {done}")


@admin.command("quarantine")
@_decorate
def quarantine_command(bootstrap: str | None, client: ClientConfig, namespace: str) -> None:
    """List quarantined transactions and raw records: tx id, group, when, status, origin, topics, reason."""
    entries = list_quarantine(_bootstrap(bootstrap, client), namespace, client.librdkafka())
    if not entries:
        click.echo(f"nothing in {Topics(namespace).quarantine}")
        return
    click.echo(f"{'tx id':36}  {'group':12}  {'quarantined (UTC)':19}  {'msgs':>4}  status")
    for e in entries:
        msgs = "-" if e.raw else str(len(e.messages))
        click.echo(
            f"{e.tx_id or '-':36}  {e.group or '-':12}  {_utc(e.quarantined_ms):19}  {msgs:>4}  {e.status()}"
        )
        details = [f"origin {e.origin or '?'}"]
        if e.requeue_of:
            details.append(f"requeue of {e.requeue_of}")
        if e.topics:
            details.append(f"topics {','.join(e.topics)}")
        details.append(f"reason: {e.reason}")
        click.echo("    " + ", ".join(details))


@admin.command("requeue")
@click.argument("tx_id", required=False)
@click.option("--all", "everything", is_flag=True, help="Every requeueable transaction not requeued yet.")
@_decorate
def requeue_command(
    bootstrap: str | None, client: ClientConfig, namespace: str, tx_id: str | None, everything: bool
) -> None:
    """Re-drive quarantined transaction TX_ID (or --all) through the coordinator, once.

    Fix the cause first (create the topic or partitions, raise the size limit). Its messages
    go out after transactions of the same key written since: requeuing reorders them.
    """
    if (tx_id is None) != everything:
        raise click.UsageError("give a TX_ID or --all (one of them)")
    address, extra = _bootstrap(bootstrap, client), client.librdkafka()
    if tx_id is not None:
        results = [requeue(address, tx_id, namespace, extra)]
    else:
        results = requeue_all(address, namespace, extra)
        if not results:
            click.echo(f"no requeueable transactions in {Topics(namespace).quarantine}")
            return
    for r in results:
        if r.error:
            click.echo(f"{r.tx_id}: not requeued: {r.error}")
        else:
            republished = "the coordinator republishes it"
            click.echo(f"{r.tx_id}: requeued as {r.new_tx_id} ({r.messages} message(s)); {republished}")
    failed = sum(1 for r in results if r.error)
    if failed:
        raise TxBridgeError(f"{failed} of {len(results)} transaction(s) not requeued (see above)")


@admin.command("pending")
@click.option(
    "--group-id",
    default=None,
    help=(
        "The coordinators' consumer group (their --group-id); default: the namespace's, "
        "txbridge-coordinator (__txbridge) or txbridge-coordinator.<namespace>."
    ),
)
@_decorate
def pending_command(
    bootstrap: str | None, client: ClientConfig, namespace: str, group_id: str | None
) -> None:
    """List transactions still pending at the coordinators' last commit: tx id, phase, group, checks.

    A transaction whose back-checks could not be sent lately (no live instance, no secret,
    a refused URL) says so: ``not asked: <why>``.
    """
    entries = list_pending(_bootstrap(bootstrap, client), namespace, group_id, client.librdkafka())
    if not entries:
        click.echo(f"no pending transactions in {Topics(namespace).state}")
        return
    click.echo(f"{'tx id':36}  {'phase':10}  {'group':12}  {'checks':>6}  {'halves':>6}  notes")
    for e in entries:
        tx, phase, group = str(e.get("tx")), str(e.get("phase")), str(e.get("group"))
        halves = len(e.get("halves", []))
        notes = (
            f"not asked since {_utc(int(e['unasked']))}: {e.get('problem', '')}" if e.get("unasked") else ""
        )
        click.echo(f"{tx:36}  {phase:10}  {group:12}  {e.get('checks', 0):>6}  {halves:>6}  {notes}".rstrip())
