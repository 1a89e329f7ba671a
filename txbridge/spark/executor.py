"""A task of the Spark sink: its rows as txbridge transactions, left undecided (no Spark import).

One producer per task, whose check URL is the driver's :class:`~txbridge.spark.SinkChecks`
(it serves no checks itself). The task's rows become messages in order, cut into
transactions (:func:`~txbridge.spark.decisions.chunks`) that share one order key, so they go
to one half partition and keep the task's row order; each is left UNKNOWN (no op record).
The task returns the transactions' ids to the driver, which decides the batch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from txbridge import wire
from txbridge.producer import TransactionProducer
from txbridge.spark.decide import journal_producer, write_journal, write_ops
from txbridge.spark.decisions import H_BATCH, JournalEntry, TxRef, batch_label, chunks
from txbridge.spark.options import SinkOptions
from txbridge.transaction import LocalTransaction, Message
from txbridge.wire import TxState

logger = logging.getLogger(__name__)


def undecided(_txn: LocalTransaction) -> TxState:
    """The task's check function (never asked: the task's producer serves no checks)."""
    return TxState.UNKNOWN


def _raw(value: Any, column: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"txbridge sink: column {column} must be binary or string, got {type(value).__name__}")


def _headers(value: Any) -> list[tuple[str, bytes]]:
    out = []
    for item in value or ():  # Rows of (key, value), as Spark's Kafka sink takes them, or mappings
        name, raw = (item["key"], item["value"]) if isinstance(item, Mapping) else item
        out.append((str(name), _raw(raw, "headers") or b""))
    return out


def row_messages(rows: Iterable[Any], opts: SinkOptions, label: str) -> Iterator[Message]:
    """The rows (``pyspark.sql.Row`` or mappings) as messages carrying :data:`H_BATCH` = ``label``.

    The ``topic`` option wins over a ``topic`` column, as in Spark's Kafka sink.
    """
    for row in rows:
        fields = row.asDict() if hasattr(row, "asDict") else dict(row)
        topic = opts.topic or fields.get("topic")
        if not topic:
            raise ValueError("txbridge sink: a row has no topic (set option topic or a topic column)")
        headers = [*_headers(fields.get("headers")), (H_BATCH, label.encode())]
        yield Message(
            str(topic),
            _raw(fields.get("value"), "value"),
            key=_raw(fields.get("key"), "key"),
            headers=headers,
        )


def write_task(
    opts: SinkOptions, rows: Iterable[Any], *, batch_id: int, partition_id: int, attempt: int
) -> list[TxRef]:
    """Write one task's rows as undecided transactions; returns them in order.

    Each transaction is journaled (:func:`~txbridge.spark.decide.write_journal`) before its
    half records, so the driver can roll back those of an attempt that dies. If the task fails
    with an exception, it rolls back the transactions it wrote at once (best effort).
    """
    label = batch_label(opts.sink_key, batch_id)
    producer = TransactionProducer(
        opts.bootstrap,
        opts.group,
        secret=opts.secret,
        check=undecided,
        namespace=opts.namespace,
        client_config=opts.client_config,
        serve_checks=False,
        advertised_url=opts.check_url,
        settle_unknown=False,
        max_message_bytes=opts.max_message_bytes,
        instance_id=f"spark-{opts.sink_key}-{batch_id}-{partition_id}-{attempt}-{uuid.uuid4().hex[:6]}",
    )
    order_key = f"{opts.sink_key}/{partition_id}".encode()
    task = f"{partition_id}/{attempt}"
    refs: list[TxRef] = []
    journal = journal_producer(opts)
    with producer:
        try:
            for chunk in chunks(row_messages(rows, opts, label), opts.max_rows, opts.max_tx_bytes):
                with producer.transaction(order_key=order_key) as tx:
                    # Where the producer puts it (the same function, on the half topic's count).
                    partition = wire.half_partition(order_key, producer.settings.partitions or 1)
                    write_journal(
                        opts,
                        JournalEntry(opts.sink_key, batch_id, tx.tx_id, partition, task, opts.check_url),
                        journal,
                    )
                    tx.send(chunk)  # the chunk's half records in one go, then one wait for them all
                    tx.set_outcome(TxState.UNKNOWN)
                refs.append(TxRef(tx.tx_id, partition, len(chunk)))  # the producer's own choice too
        except BaseException:
            _roll_back_quietly(opts, refs)
            raise
    return refs


def _roll_back_quietly(opts: SinkOptions, refs: Sequence[TxRef]) -> None:
    try:
        write_ops(opts, [(r, TxState.ROLLBACK) for r in refs])
    except Exception as exc:  # the back-check rolls them back once the batch is decided
        logger.warning("rolling back a failed task's %d transactions failed: %s", len(refs), exc)
