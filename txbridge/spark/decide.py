"""The driver's side of a batch: its decision record, then the op records (Kafka I/O, no Spark).

:func:`commit_batch` is the sink's commit point. If a decision record for the batch exists
(a run before a driver restart decided it), that record wins: this run's transactions are
rolled back and the recorded ones get their COMMIT op again (a repeated op is counted and
ignored by the coordinator: the first decision is final). Otherwise the record is written,
acknowledged by every in-sync replica and flushed, and only then the COMMIT ops.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txbridge import kafka
from txbridge._side_topics import read_committed
from txbridge.errors import KafkaOperationError
from txbridge.spark.decisions import BatchDecision, JournalEntry, TxRef, decode_record, sink_topic
from txbridge.spark.options import SinkOptions
from txbridge.wire import OpRecord, OpSource, Topics, TxState

logger = logging.getLogger(__name__)

#: The instance named in the sink's op records.
DRIVER_INSTANCE = "spark-sink"
#: Test hook: ``"<stage>:<batch id>:<file>"`` makes :func:`commit_batch` create ``file`` and
#: sleep at ``stage`` (``before-decision`` or ``after-decision``) of that batch, so a test can
#: kill the driver there.
PAUSE_ENV = "TXBRIDGE_SPARK_SINK_TEST_PAUSE"
_FLUSH_S = 60.0


def ensure_sink_topic(opts: SinkOptions) -> None:
    """Create ``<ns>_spark_sink`` (compacted, one partition) unless it exists."""
    spec = kafka.TopicSpec(
        sink_topic(opts.namespace), 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"}
    )
    kafka.ensure_topics(opts.bootstrap, [spec], extra=kafka.settings_for("admin", opts.librdkafka()))


def read_records(opts: SinkOptions) -> list[BatchDecision | JournalEntry]:
    """Every decision record and journal entry of ``<ns>_spark_sink`` (any sink), oldest first."""
    found = []
    extra = kafka.settings_for("consumer", opts.librdkafka())
    for msg in read_committed(opts.bootstrap, sink_topic(opts.namespace), extra=extra):
        record = decode_record(msg.value())
        if record is not None:
            found.append(record)
    return found


def _batch_state(opts: SinkOptions, batch_id: int) -> tuple[BatchDecision | None, list[JournalEntry]]:
    """This sink's first decision record of batch ``batch_id`` (if any) and its journal entries."""
    decision = None
    journal = []
    for record in read_records(opts):
        if record.sink_key != opts.sink_key or record.batch_id != batch_id:
            continue
        if isinstance(record, JournalEntry):
            journal.append(record)
        elif decision is None:
            decision = record
    return decision, journal


def recorded(opts: SinkOptions, batch_id: int) -> BatchDecision | None:
    """The first decision record of this sink's batch ``batch_id``, if any."""
    return _batch_state(opts, batch_id)[0]


def commit_batch(opts: SinkOptions, batch_id: int, refs: Sequence[TxRef]) -> BatchDecision:
    """Decide batch ``batch_id`` with the transactions ``refs`` (in order), or with the
    decision an earlier run recorded. Returns the decision in force.

    Every other transaction of the batch (this run's when an earlier decision stands, and the
    journaled ones of dead attempts and superseded runs) gets its ROLLBACK first, then the
    chosen ones their COMMITs, then the batch's journal entries their tombstones.

    Raises:
        KafkaOperationError: the decision record or an op record was not acknowledged.
            Nothing is lost: a decision record that landed is found by the next run of the
            batch (Spark runs it again), and the check server answers from it meanwhile.
    """
    earlier, journal = _batch_state(opts, batch_id)
    decision = earlier or BatchDecision(opts.sink_key, batch_id, tuple(refs), opts.sink_id)
    chosen = {t.tx_id for t in decision.txs}
    strays = _unique([*(r for r in refs if r.tx_id not in chosen), *_journaled(journal, chosen)])
    if earlier is not None:
        logger.info(
            "batch %d of sink %s was decided before (%d transactions): rolling back this run's %d",
            batch_id,
            opts.sink_key,
            len(earlier.txs),
            len(refs),
        )
    write_ops(opts, [(r, TxState.ROLLBACK) for r in strays])
    if earlier is None:
        _pause("before-decision", batch_id)
        _write_decision(opts, decision)
        _pause("after-decision", batch_id)
    write_ops(opts, [(r, TxState.COMMIT) for r in decision.txs])
    _forget(opts, journal)
    return decision


def abort_batch(opts: SinkOptions, batch_id: int, refs: Sequence[TxRef]) -> None:
    """Roll back the transactions ``refs`` of batch ``batch_id`` (and its journaled ones); if
    the batch was decided before (its record landed, then something failed), keep that
    decision instead."""
    earlier, journal = _batch_state(opts, batch_id)
    if earlier is not None:
        commit_batch(opts, batch_id, refs)
        return
    write_ops(opts, [(r, TxState.ROLLBACK) for r in _unique([*refs, *_journaled(journal, set())])])


def _journaled(journal: Sequence[JournalEntry], chosen: set[str]) -> list[TxRef]:
    return [TxRef(j.tx_id, j.partition, 0) for j in journal if j.tx_id not in chosen]


def _unique(refs: Sequence[TxRef]) -> list[TxRef]:
    seen: set[str] = set()
    out = []
    for ref in refs:
        if ref.tx_id not in seen:
            seen.add(ref.tx_id)
            out.append(ref)
    return out


def journal_producer(opts: SinkOptions) -> Any:
    """A producer for a task's journal entries (one per task: :func:`write_journal` reuses it)."""
    return _producer(opts)


def write_journal(opts: SinkOptions, entry: JournalEntry, producer: Any) -> None:
    """Record, acknowledged, that a task attempt is about to write transaction ``entry.tx_id``.

    Raises:
        KafkaOperationError: it was not acknowledged (the task then fails before writing).
    """
    _produce_all(
        opts, [(sink_topic(opts.namespace), 0, entry.key, entry.encode())], "the journal entry", producer
    )


def _forget(opts: SinkOptions, journal: Sequence[JournalEntry]) -> None:
    """Tombstones for a decided batch's journal entries (compaction then drops them)."""
    if not journal:
        return
    try:
        _produce_all(opts, [(sink_topic(opts.namespace), 0, j.key, None) for j in journal], "tombstones")
    except KafkaOperationError as exc:  # they only cost space; the next decision of the batch is the same
        logger.warning("the journal of a decided batch was not cleared: %s", exc)


def _producer(opts: SinkOptions) -> Any:
    extra = kafka.settings_for("producer", opts.librdkafka())
    return kafka.producer(opts.bootstrap, extra, linger_ms=0)


def _write_decision(opts: SinkOptions, decision: BatchDecision) -> None:
    _produce_all(
        opts, [(sink_topic(opts.namespace), 0, decision.key, decision.encode())], "the decision record"
    )


def write_ops(opts: SinkOptions, decisions: Sequence[tuple[TxRef, TxState]]) -> None:
    """One op record per ``(transaction, state)``, in order, each acknowledged.

    Raises:
        KafkaOperationError: one was not acknowledged.
    """
    if not decisions:
        return
    op_topic = Topics(opts.namespace).op
    records = []
    for ref, state in decisions:
        key, value = OpRecord(
            ref.tx_id,
            state,
            OpSource.PRODUCER,
            count=ref.count if state is TxState.COMMIT else None,
            group=opts.group,
            instance=DRIVER_INSTANCE,
            reason="txbridge spark sink",
        ).encode()
        records.append((op_topic, ref.partition, key, value))
    _produce_all(opts, records, "op records")


def _produce_all(
    opts: SinkOptions,
    records: Sequence[tuple[str, int, bytes, bytes | None]],
    what: str,
    producer: Any = None,
) -> None:
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = producer or _producer(opts)
    for topic, partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(_FLUSH_S)
    if failures or left:
        raise KafkaOperationError(
            f"txbridge spark sink: {what} not acknowledged ({left} still queued): "
            f"{failures[0] if failures else 'timed out'}"
        )


def _pause(stage: str, batch_id: int) -> None:
    plan = os.environ.get(PAUSE_ENV, "")
    parts = plan.split(":", 2)
    if len(parts) == 3 and parts[0] == stage and parts[1] == str(batch_id):
        Path(parts[2]).write_text(f"{os.getpid()}\n")
        logger.warning("test hook %s: pausing at %s of batch %d", PAUSE_ENV, stage, batch_id)
        time.sleep(3600)
