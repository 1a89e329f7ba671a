"""``txbridge admin``: inspect and settle what the coordinator set aside (rocketmq-dashboard #4343, #4435).

Expired transactions. A transaction whose back-checks were exhausted was rolled
back by the coordinator and its half records copied to ``<ns>_expired``. An
operator lists them and resolves one: ``--commit`` republishes its messages from
``<ns>_expired``, ``--rollback`` records the rollback; either way with an
``admin`` op record (the audit trail the coordinator notes).

Quarantined transactions. A committed transaction the coordinator could not
republish (its topic or partition did not exist, a message was too large) was
copied whole to ``<ns>_quarantine``. Once the cause is fixed, ``requeue`` re-drives
it through the coordinator: its messages become the half records of a new
transaction, decided COMMIT by an ``admin`` op record with its message count, and
the coordinator republishes them like any committed transaction (or quarantines
them again if the cause is still there).

Each decision happens at most once per transaction, even with two operators at the
same time: it goes through :func:`txbridge._admin_once.decide_once`, which fences
concurrent admins of the same tx id and keeps a marker beside the copies.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from txbridge import _kafka
from txbridge._admin_once import RESOLVE, AlreadyDecidedError, Marker, decide_once, decode_marker
from txbridge._quarantine import Quarantined, RequeueResult, list_quarantine, requeue, requeue_all
from txbridge._side_topics import (
    Extra,
    as_dict,
    check_destinations,
    origin_of,
    original,
    produce,
    read_committed,
    reason_of,
)
from txbridge.errors import TxBridgeError, WireFormatError
from txbridge.wire import (
    DEFAULT_COORDINATOR_GROUP,
    DEFAULT_NAMESPACE,
    H_CHECKS,
    HalfMessage,
    OpRecord,
    OpSource,
    Topics,
    TxState,
    decode_half,
    decode_light,
    decode_op,
    header_dict,
)

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

__all__ = [
    "AlreadyDecidedError",
    "ExpiredTx",
    "Marker",
    "Quarantined",
    "RequeueResult",
    "admin",
    "list_expired",
    "list_pending",
    "list_quarantine",
    "requeue",
    "requeue_all",
    "resolve",
]


@dataclass
class ExpiredTx:
    """An expired transaction as ``<ns>_expired`` holds it."""

    tx_id: str
    group: str = ""
    reason: str = ""
    checks: int = 0
    partition: int | None = None  # its half/op partition (from txb.origin)
    messages: list[HalfMessage] = field(default_factory=list)
    resolved: Marker | None = None  # an admin's decision on it

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})


def list_expired(bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None) -> list[ExpiredTx]:
    """Every transaction in ``<ns>_expired``, oldest first, with an admin's decision if any."""
    found: dict[str, ExpiredTx] = {}
    markers: dict[str, Marker] = {}
    for msg in read_committed(bootstrap, Topics(namespace).expired, extra=extra):
        marker = decode_marker(msg.headers(), msg.value())
        if marker is not None:
            markers.setdefault(marker.tx_id, marker)
            continue
        headers = header_dict(msg.headers())
        try:
            half = decode_half(msg.value(), msg.headers())
        except WireFormatError:
            continue  # not a half copy; nothing to resolve
        entry = found.setdefault(half.tx_id, ExpiredTx(half.tx_id, half.group))
        entry.reason = reason_of(headers)
        entry.checks = int(headers.get(H_CHECKS, b"0") or 0)
        entry.partition = origin_of(headers)[1]
        if all(m.seq != half.seq for m in entry.messages):
            entry.messages.append(original(half))
    for entry in found.values():
        entry.messages.sort(key=lambda m: m.seq)
        entry.resolved = markers.get(entry.tx_id)
    return list(found.values())


def admin_decisions(
    bootstrap: str, namespace: str, tx_id: str, partition: int, extra: Extra = None
) -> list[OpRecord]:
    """Admin op records written for ``tx_id`` in its op partition (all a resolution left before markers)."""
    ops = []
    for msg in read_committed(bootstrap, Topics(namespace).op, [partition], extra=extra):
        if msg.key() != tx_id.encode():
            continue
        try:
            op = decode_op(msg.value())
        except WireFormatError:
            continue
        if op.source is OpSource.ADMIN:
            ops.append(op)
    return ops


def resolve(
    bootstrap: str,
    tx_id: str,
    state: TxState,
    namespace: str = DEFAULT_NAMESPACE,
    extra: Extra = None,
    *,
    entry: ExpiredTx | None = None,
) -> ExpiredTx:
    """Resolve an expired transaction, at most once; COMMIT republishes its messages.

    One Kafka transaction carries the messages (COMMIT), an ``admin`` op record and the
    decision's marker in ``<ns>_expired``. Concurrent resolutions of one transaction:
    one commits, the others are fenced or see its marker (see :mod:`txbridge._admin_once`).

    Args:
        entry: the transaction as :func:`list_expired` gave it (listed again when None).

    Raises:
        TxBridgeError: the transaction is not in ``<ns>_expired``, or a topic of it is missing.
        AlreadyDecidedError: an admin resolved it before, or at the same time.
        KafkaOperationError: nothing was committed; the message says whether anything was published.
    """
    if state is TxState.UNKNOWN:
        raise TxBridgeError("an admin resolution is COMMIT or ROLLBACK")
    topics = Topics(namespace)
    if entry is None:  # the caller may have listed it already (the coordinator's resumer)
        entry = next((e for e in list_expired(bootstrap, namespace, extra) if e.tx_id == tx_id), None)
    if entry is None or entry.partition is None:
        raise TxBridgeError(f"transaction {tx_id} is not in {topics.expired}: see 'txbridge admin expired'")
    if entry.resolved is not None:
        raise AlreadyDecidedError(
            f"transaction {tx_id} was already {entry.resolved.describe()} by an admin", entry.resolved
        )
    if state is TxState.COMMIT:
        check_destinations(bootstrap, entry.messages, extra)
    partition = entry.partition

    def earlier() -> Marker | None:
        # Resolutions made before markers existed left only their admin op record.
        ops = admin_decisions(bootstrap, namespace, tx_id, partition, extra)
        return Marker(tx_id, RESOLVE, ops[0].state, attempt="op") if ops else None

    def write(producer: Any) -> None:
        if state is TxState.COMMIT:
            for msg in entry.messages:
                headers = msg.republish_headers()
                produce(producer, msg.topic, msg.key, msg.value, headers=headers, partition=msg.partition)
        key, value = OpRecord(
            tx_id, state, OpSource.ADMIN, group=entry.group, reason="txbridge admin"
        ).encode()
        produce(producer, topics.op, key, value, partition=partition)

    draft = Marker(tx_id, RESOLVE, state, attempt="")
    entry.resolved = decide_once(
        bootstrap, namespace, topics.expired, draft, write, earlier=earlier, extra=as_dict(extra)
    )
    return entry


def list_pending(
    bootstrap: str,
    namespace: str = DEFAULT_NAMESPACE,
    group_id: str = DEFAULT_COORDINATOR_GROUP,
    extra: Extra = None,
) -> list[dict[str, Any]]:
    """Transactions pending at the coordinators' last commits.

    The live entries of ``<ns>_state``, and the young transactions that the coordinators
    of ``group_id`` listed in their committed half offsets instead (phase ``open``, no checks).
    """
    latest: dict[bytes, bytes | None] = {}
    for msg in read_committed(bootstrap, Topics(namespace).state, extra=extra):
        latest[msg.key() or b""] = msg.value()
    out = []
    for value in latest.values():
        if value is None:
            continue
        try:
            out.append(json.loads(value))
        except ValueError:
            continue
    known = {str(e.get("tx")) for e in out}
    young = _young(bootstrap, Topics(namespace).half, group_id, extra)
    out.extend(e for e in young if e["tx"] not in known)
    return sorted(out, key=lambda e: str(e.get("tx", "")))


def _young(
    bootstrap: str, half_topic: str, group_id: str, extra: Extra = None, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Young transactions listed in the committed half offsets' metadata, read from their halves."""
    # Same group id, never subscribed: it only reads the group's committed offsets.
    consumer = _kafka.consumer(bootstrap, group_id, as_dict(extra))
    try:
        meta = consumer.list_topics(half_topic, timeout=10).topics.get(half_topic)
        if meta is None or meta.error is not None:
            return []
        committed = consumer.committed([_kafka.partition_at(half_topic, p) for p in meta.partitions], 10)
        wanted = {tp.partition: decode_light(tp.offset, tp.metadata) for tp in committed if tp.offset > 0}
        found: dict[str, dict[str, Any]] = {}
        for partition, offsets in wanted.items():
            if not offsets:
                continue
            consumer.assign([_kafka.partition_at(half_topic, partition, offsets[0])])
            deadline, reached = time.monotonic() + timeout, -1
            while reached < offsets[-1] and time.monotonic() < deadline:
                for msg in _kafka.consume_available(consumer, 500, 0.5):
                    if msg.error() is not None:
                        continue
                    reached = max(reached, msg.offset())
                    if msg.offset() not in offsets:
                        continue
                    half = decode_half(msg.value(), msg.headers())
                    entry = found.setdefault(
                        half.tx_id,
                        {"tx": half.tx_id, "p": partition, "phase": "open", "group": half.group, "checks": 0},
                    )
                    entry.setdefault("halves", []).append([half.seq, msg.offset()])
            consumer.unassign()
        return list(found.values())
    finally:
        consumer.close()


# ------------------------------------------------------------------ CLI


@click.group("admin")
def admin() -> None:
    """Inspect and settle transactions the coordinator could not decide or republish."""


def _namespace_option(func: Any) -> Any:
    return click.option(
        "--namespace", envvar="TXBRIDGE_NAMESPACE", default=DEFAULT_NAMESPACE, show_default=True
    )(func)


def _bootstrap(bootstrap: str | None, client: ClientConfig) -> str:
    from txbridge.cli import resolve_bootstrap

    return resolve_bootstrap(bootstrap, client=client)


def _decorate(func: Any) -> Any:
    from txbridge.cli import _one_line_errors, bootstrap_option, client_options

    return bootstrap_option(client_options(_namespace_option(_one_line_errors(func))))


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
    default=DEFAULT_COORDINATOR_GROUP,
    show_default=True,
    help="The coordinators' consumer group (their --group-id).",
)
@_decorate
def pending_command(bootstrap: str | None, client: ClientConfig, namespace: str, group_id: str) -> None:
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
