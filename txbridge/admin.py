"""``txbridge admin``: inspect and resolve expired transactions (rocketmq-dashboard #4343, #4435).

A transaction whose back-checks were exhausted was rolled back by the coordinator
and its half records copied to ``<ns>_expired``. An operator can list them and
resolve one: ``--commit`` republishes its messages from ``<ns>_expired`` in one
Kafka transaction together with an ``admin`` COMMIT op record; ``--rollback``
writes an ``admin`` ROLLBACK op record (the audit trail of the decision).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import click

from txbridge import _kafka
from txbridge.errors import KafkaOperationError, TxBridgeError, WireFormatError
from txbridge.wire import (
    DEFAULT_COORDINATOR_GROUP,
    DEFAULT_NAMESPACE,
    H_CHECKS,
    H_ORIGIN,
    H_REASON,
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

_ASIDE_HEADERS = frozenset({H_REASON, H_ORIGIN, H_CHECKS})


@dataclass
class ExpiredTx:
    """An expired transaction as ``<ns>_expired`` holds it."""

    tx_id: str
    group: str = ""
    reason: str = ""
    checks: int = 0
    partition: int | None = None  # its half/op partition (from txb.origin)
    messages: list[HalfMessage] = field(default_factory=list)

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})


def _read_all(
    bootstrap: str, topic: str, partitions: list[int] | None = None, timeout: float = 60.0
) -> list[Any]:
    consumer = _kafka.consumer(bootstrap, f"txbridge-admin-{uuid.uuid4().hex[:8]}", enable_partition_eof=True)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TxBridgeError(
                f"topic {topic} does not exist: run 'txbridge init' with the right --namespace"
            )
        wanted = sorted(meta.partitions) if partitions is None else partitions
        consumer.assign([_kafka.partition_at(topic, p, _kafka.OFFSET_BEGINNING) for p in wanted])
        pending, records = set(wanted), []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"reading {topic}: partitions {sorted(pending)} did not reach their end"
                )
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is None:
                    records.append(msg)
                elif _kafka.is_partition_eof(err):
                    pending.discard(msg.partition())
                else:
                    raise _kafka.to_error(err, f"reading {topic}")
        return records
    finally:
        consumer.close()


def list_expired(bootstrap: str, namespace: str = DEFAULT_NAMESPACE) -> list[ExpiredTx]:
    """Every transaction in ``<ns>_expired``, oldest first."""
    found: dict[str, ExpiredTx] = {}
    for msg in _read_all(bootstrap, Topics(namespace).expired):
        headers = header_dict(msg.headers())
        try:
            half = decode_half(msg.value(), msg.headers())
        except WireFormatError:
            continue  # not a half copy; nothing to resolve
        entry = found.setdefault(half.tx_id, ExpiredTx(half.tx_id, half.group))
        entry.reason = headers.get(H_REASON, b"").decode("utf-8", "replace")
        entry.checks = int(headers.get(H_CHECKS, b"0") or 0)
        origin = headers.get(H_ORIGIN, b"").decode("utf-8", "replace").split("/")
        if len(origin) == 3 and origin[1].isdigit():
            entry.partition = int(origin[1])
        clean = tuple((n, v) for n, v in half.user_headers if n not in _ASIDE_HEADERS)
        if all(m.seq != half.seq for m in entry.messages):
            entry.messages.append(_with_headers(half, clean))
    for entry in found.values():
        entry.messages.sort(key=lambda m: m.seq)
    return list(found.values())


def _with_headers(half: HalfMessage, headers: tuple[tuple[str, bytes], ...]) -> HalfMessage:
    return replace(half, user_headers=headers)


def admin_decisions(bootstrap: str, namespace: str, tx_id: str, partition: int) -> list[OpRecord]:
    """Admin op records already written for ``tx_id`` (so a resolution is not applied twice)."""
    ops = []
    for msg in _read_all(bootstrap, Topics(namespace).op, [partition]):
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
    extra: Mapping[str, Any] | None = None,
) -> ExpiredTx:
    """Resolve an expired transaction; COMMIT republishes its messages, in one Kafka transaction.

    Raises:
        TxBridgeError: the transaction is not in ``<ns>_expired``, or was already resolved by an admin.
    """
    if state is TxState.UNKNOWN:
        raise TxBridgeError("an admin resolution is COMMIT or ROLLBACK")
    topics = Topics(namespace)
    entry = next((e for e in list_expired(bootstrap, namespace) if e.tx_id == tx_id), None)
    if entry is None or entry.partition is None:
        raise TxBridgeError(f"transaction {tx_id} is not in {topics.expired}: see 'txbridge admin expired'")
    done = admin_decisions(bootstrap, namespace, tx_id, entry.partition)
    if done:
        raise TxBridgeError(f"transaction {tx_id} was already resolved by an admin: {done[0].state.value}")
    producer = _kafka.producer(bootstrap, extra, transactional_id=f"txbridge-admin-{tx_id}")
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        if state is TxState.COMMIT:
            for msg in entry.messages:
                kwargs: dict[str, Any] = {
                    "key": msg.key,
                    "value": msg.value,
                    "headers": msg.republish_headers(),
                }
                if msg.partition is not None:
                    kwargs["partition"] = msg.partition
                producer.produce(msg.topic, **kwargs)
        key, value = OpRecord(
            tx_id, state, OpSource.ADMIN, group=entry.group, reason="txbridge admin"
        ).encode()
        producer.produce(topics.op, key=key, value=value, partition=entry.partition)
        producer.commit_transaction(30)
    except Exception as exc:
        raise _kafka.to_error(exc, f"resolving {tx_id}") from exc
    return entry


def list_pending(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, group_id: str = DEFAULT_COORDINATOR_GROUP
) -> list[dict[str, Any]]:
    """Transactions pending at the coordinators' last commits.

    The live entries of ``<ns>_state``, and the young transactions that the coordinators
    of ``group_id`` listed in their committed half offsets instead (phase ``open``, no checks).
    """
    latest: dict[bytes, bytes | None] = {}
    for msg in _read_all(bootstrap, Topics(namespace).state):
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
    out.extend(e for e in _young(bootstrap, Topics(namespace).half, group_id) if e["tx"] not in known)
    return sorted(out, key=lambda e: str(e.get("tx", "")))


def _young(bootstrap: str, half_topic: str, group_id: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Young transactions listed in the committed half offsets' metadata, read from their halves."""
    # Same group id, never subscribed: it only reads the group's committed offsets.
    consumer = _kafka.consumer(bootstrap, group_id)
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
    """Inspect and resolve transactions the coordinator could not decide."""


def _namespace_option(func: Any) -> Any:
    return click.option(
        "--namespace", envvar="TXBRIDGE_NAMESPACE", default=DEFAULT_NAMESPACE, show_default=True
    )(func)


def _bootstrap(bootstrap: str | None) -> str:
    from txbridge.cli import resolve_bootstrap

    return resolve_bootstrap(bootstrap)


def _decorate(func: Any) -> Any:
    from txbridge.cli import _one_line_errors, bootstrap_option

    return bootstrap_option(_namespace_option(_one_line_errors(func)))


@admin.command("expired")
@_decorate
def expired_command(bootstrap: str | None, namespace: str) -> None:
    """List expired transactions: tx id, group, topics, checks, reason."""
    entries = list_expired(_bootstrap(bootstrap), namespace)
    if not entries:
        click.echo(f"no expired transactions in {Topics(namespace).expired}")
        return
    click.echo(f"{'tx id':36}  {'group':12}  {'checks':>6}  {'msgs':>4}  topics / reason")
    for e in entries:
        topics = ",".join(e.topics)
        click.echo(f"{e.tx_id:36}  {e.group:12}  {e.checks:>6}  {len(e.messages):>4}  {topics} / {e.reason}")


@admin.command("resolve")
@click.argument("tx_id")
@click.option("--commit", "decision", flag_value="COMMIT", help="Republish its messages.")
@click.option("--rollback", "decision", flag_value="ROLLBACK", help="Record the rollback.")
@_decorate
def resolve_command(bootstrap: str | None, namespace: str, tx_id: str, decision: str | None) -> None:
    """Resolve an expired transaction TX_ID with --commit or --rollback."""
    if decision is None:
        raise click.UsageError("say --commit or --rollback")
    entry = resolve(_bootstrap(bootstrap), tx_id, TxState(decision), namespace)
    done = f"republished {len(entry.messages)} message(s)" if decision == "COMMIT" else "rollback recorded"
    click.echo(f"{tx_id}: {decision} by admin, {done}")


@admin.command("pending")
@click.option(
    "--group-id",
    default=DEFAULT_COORDINATOR_GROUP,
    show_default=True,
    help="The coordinators' consumer group (their --group-id).",
)
@_decorate
def pending_command(bootstrap: str | None, namespace: str, group_id: str) -> None:
    """List transactions still pending at the coordinators' last commit: tx id, phase, group, checks."""
    entries = list_pending(_bootstrap(bootstrap), namespace, group_id)
    if not entries:
        click.echo(f"no pending transactions in {Topics(namespace).state}")
        return
    click.echo(f"{'tx id':36}  {'phase':10}  {'group':12}  {'checks':>6}  halves")
    for e in entries:
        tx, phase, group = str(e.get("tx")), str(e.get("phase")), str(e.get("group"))
        click.echo(f"{tx:36}  {phase:10}  {group:12}  {e.get('checks', 0):>6}  {len(e.get('halves', []))}")
