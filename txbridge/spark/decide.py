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
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from txbridge import kafka
from txbridge.admin import AlreadyDecidedError, list_expired, resolve
from txbridge.admin.side_topics import read_committed, watermarks
from txbridge.errors import KafkaOperationError, ProducerFencedError, TxBridgeError, WireFormatError
from txbridge.spark.decisions import BatchDecision, JournalEntry, TxRef, decode_record, sink_topic
from txbridge.spark.options import SinkOptions
from txbridge.wire import POSITIONS_KEY, OpRecord, OpSource, Positions, Topics, TxState, parse_journal_key

logger = logging.getLogger(__name__)

#: The instance named in the sink's op records.
DRIVER_INSTANCE = "spark-sink"
#: Test hook: ``"<stage>:<batch id>:<file>"`` makes :func:`commit_batch` create ``file`` and
#: wait at ``stage`` (``before-read``, ``before-decision`` or ``after-decision``) of that batch,
#: so a test can kill the driver there, or let it go on by creating ``<file>.go``.
PAUSE_ENV = "TXBRIDGE_SPARK_SINK_TEST_PAUSE"
_FLUSH_S = 60.0
#: How long a commit waits for the coordinators to read past its COMMITs (:func:`wait_read_past`).
READ_PAST_S = 10.0
#: A decision's Kafka transaction left open by a killed driver is aborted by the broker after
#: this, so readers of ``<ns>_spark_sink`` (read_committed) are never held longer.
_TXN_TIMEOUT_MS = 30_000


class DriverFencedError(TxBridgeError):
    """Another driver of the same sink (a restart from the same checkpoint) decides this batch."""


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

    One driver decides: first a Kafka transactional producer whose ``transactional.id`` is the
    sink's (:func:`fence_id`) is initialised, which fences every earlier driver of this sink
    (a zombie and its restart on one checkpoint); only then the batch is read, and the decision
    record goes out in a Kafka transaction of that producer. A driver fenced meanwhile cannot
    commit its record and writes no op; the one that committed a record, or found one, writes
    the ops of that record only, so two drivers' ops never contradict each other.

    Then every other transaction of the batch (this run's when an earlier decision stands, and
    the journaled ones of dead attempts and superseded runs) gets its ROLLBACK, then the chosen
    ones their COMMITs (so on a shared op partition a ROLLBACK comes first), then the expired
    ones of the record are published (:func:`publish_expired`), then the batch's journal
    entries get their tombstones.

    Raises:
        DriverFencedError: another driver of this sink took over the batch; nothing of this
            call was written.
        KafkaOperationError: the decision record or an op record was not acknowledged.
            Nothing is lost: a decision record that landed is found by the next run of the
            batch (Spark runs it again), and the check server answers from it meanwhile.
    """
    fence = _fence(opts, batch_id)
    try:
        _pause("before-read", batch_id)
        earlier, journal = _batch_state(opts, batch_id)
        decision = earlier or BatchDecision(opts.sink_key, batch_id, tuple(refs), opts.sink_id)
        if earlier is None:
            _pause("before-decision", batch_id)
            _write_decision(opts, decision, fence)
            _pause("after-decision", batch_id)
    finally:
        _close(fence)
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
    # The marks are taken before the COMMITs go out: a coordinator transaction that read past
    # one is written after it, so its positions record is at or above the mark.
    with following_positions(opts, {t.partition for t in decision.txs}) as positions:
        commits = write_ops(opts, [(r, TxState.COMMIT) for r in decision.txs])
        wait_read_past(commits, positions)
    publish_expired(opts, decision)
    _forget(opts, journal)
    return decision


def wait_read_past(
    ops: Mapping[int, int],
    positions: Callable[[], Mapping[int, Positions]],
    timeout: float = READ_PAST_S,
    poll_s: float = 0.2,
) -> bool:
    """Wait until the coordinators' committed op positions are past ``ops`` (op partition -> the
    offset of this batch's last COMMIT there), at most ``timeout``. Returns whether they are.

    A coordinator commits a partition's positions in the same Kafka transaction as the expiries
    it decided before them. So once its op position is past a COMMIT, an expiry decided before
    that COMMIT was read is in ``<ns>_expired`` (or open there, which :func:`publish_expired`
    waits for); read earlier, an expiry committed just after it would leave the COMMIT ignored
    while the write reports success. A COMMIT the coordinator ignores (a repeat, or one after an
    expiry) may move no position until other work comes: the wait then ends at ``timeout``, by
    which time an expiry decided before it has long been written.
    """
    waiting = dict(ops)
    deadline = time.monotonic() + timeout
    while waiting:
        now = positions()
        waiting = {p: offset for p, offset in waiting.items() if p not in now or (now[p].op or 0) <= offset}
        if not waiting:
            return True
        if time.monotonic() > deadline:
            logger.info(
                "txbridge spark sink: op positions of %s not past this batch's COMMITs after %.0fs",
                sorted(waiting),
                timeout,
            )
            return False
        time.sleep(poll_s)
    return True


@contextmanager
def following_positions(
    opts: SinkOptions, partitions: set[int]
) -> Iterator[Callable[[], Mapping[int, Positions]]]:
    """A function returning the furthest op positions the coordinators committed for the
    partitions ``partitions`` since this was entered (read_committed: only those of committed
    coordinator transactions).

    A partition's positions are in its owner's journal, any ``<ns>_state`` partition
    (:func:`txbridge.wire.journal_key`), or, written by a txbridge from before the journal, in
    its own: every partition is followed. Each owner starts from where the one before it
    stopped, so the furthest op position any of them committed is where the partition stands.
    """
    latest: dict[int, Positions] = {}
    if not partitions:
        yield lambda: latest
        return
    extra = kafka.settings_for("consumer", opts.librdkafka())
    state = Topics(opts.namespace).state
    marks = watermarks(opts.bootstrap, state, None, extra=extra, open_included=True)
    consumer = kafka.consumer(opts.bootstrap, f"txbridge-admin-{uuid.uuid4().hex[:8]}", extra)
    consumer.assign([kafka.partition_at(state, p, high) for p, (_low, high) in marks.items()])

    def read() -> Mapping[int, Positions]:
        for msg in kafka.consume_available(consumer, 1000, 0.05):
            if msg.error() is not None or not msg.value():
                continue
            owned = parse_journal_key(msg.key())
            number = owned[1] if owned is not None else (msg.partition() or 0)
            if (owned is None and msg.key() != POSITIONS_KEY) or number not in partitions:
                continue
            try:
                where = Positions.decode(msg.value())
            except WireFormatError:
                continue
            if number not in latest or (where.op or 0) > (latest[number].op or 0):
                latest[number] = where
        return latest

    try:
        yield read
    finally:
        consumer.close()


def publish_expired(opts: SinkOptions, decision: BatchDecision) -> list[str]:
    """Publish, once, the transactions of ``decision`` that the coordinator expired before their
    COMMIT reached it; returns their ids.

    The coordinator's first decision is final, and an expiry is one (a rollback): a COMMIT op
    that comes after it is ignored. That happens when the coordinator could not ask about a
    transaction for ``max_unasked_s`` (no check server it may reach), or when it predates the
    RUNNING answer and the batch outlasted ``max_checks``. Such a transaction sits in
    ``<ns>_expired``; it is resolved COMMIT through the exactly-once step of
    ``txbridge admin resolve`` (fenced per transaction: published at most once, however many
    drivers or coordinators resolve it at the same moment), in the decision's order.

    Raises:
        TxBridgeError: one of them was resolved ROLLBACK by someone else, or could not be
            published; the message names them (``txbridge admin expired`` lists them).
    """
    chosen = {t.tx_id: n for n, t in enumerate(decision.txs)}
    extra = opts.librdkafka()
    found = [
        e
        for e in list_expired(opts.bootstrap, opts.namespace, extra, wait_for_open=True)
        if e.tx_id in chosen
    ]
    failed: list[str] = []
    for entry in sorted(found, key=lambda e: chosen[e.tx_id]):
        marker = entry.resolved
        if marker is None:
            try:
                marker = resolve(
                    opts.bootstrap, entry.tx_id, TxState.COMMIT, opts.namespace, extra, entry=entry
                ).resolved
            except AlreadyDecidedError as exc:  # resolved meanwhile (a coordinator's resumer, an admin)
                marker = exc.marker
            except TxBridgeError as exc:
                failed.append(f"{entry.tx_id} ({exc})")
                continue
        if marker is None or marker.state is not TxState.COMMIT:
            failed.append(f"{entry.tx_id} (resolved {marker.state if marker else '?'} by an admin)")
    if found:
        logger.warning(
            "batch %d of sink %s: %d of its transactions had expired in the coordinator before their "
            "COMMIT; published through the exactly-once resolve path, %d failed",
            decision.batch_id,
            decision.sink_key,
            len(found),
            len(failed),
        )
    if failed:
        raise TxBridgeError(
            f"txbridge spark sink: batch {decision.batch_id} is decided, but {len(failed)} of its "
            f"transactions expired in the coordinator and are not published: {'; '.join(failed)}. "
            "See 'txbridge admin expired'; 'txbridge admin resolve --commit <tx id>' publishes one"
        )
    return [e.tx_id for e in found]


def abort_batch(opts: SinkOptions, batch_id: int, refs: Sequence[TxRef]) -> None:
    """Roll back the transactions ``refs`` of batch ``batch_id`` (and the ones this run's
    task attempts journaled); if the batch was decided before (its record landed, then
    something failed), keep that decision instead.

    Only this run's: another driver of the sink (a restart while this one is a zombie) may
    be deciding the batch with its own journaled transactions, which an abort here must not
    roll back. Its decision rolls back ours (they are journaled), or they expire.
    """
    earlier, journal = _batch_state(opts, batch_id)
    if earlier is not None:
        commit_batch(opts, batch_id, refs)
        return
    own = [j for j in journal if j.check_url == opts.check_url]
    write_ops(opts, [(r, TxState.ROLLBACK) for r in _unique([*refs, *_journaled(own, set())])])


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


def fence_id(opts: SinkOptions) -> str:
    """The ``transactional.id`` of the sink's decisions: one per namespace and sink."""
    return f"{opts.namespace}-spark-sink-{opts.sink_key}"


def _fence(opts: SinkOptions, batch_id: int) -> Any:
    """A transactional producer of the sink's :func:`fence_id`, initialised: every earlier
    driver of this sink is fenced (its open Kafka transaction aborted, or its commit completed
    first, so the read that follows sees it)."""
    extra = kafka.settings_for("producer", opts.librdkafka())
    producer = kafka.producer(
        opts.bootstrap,
        extra,
        linger_ms=0,
        transactional_id=fence_id(opts),
        transaction_timeout_ms=_TXN_TIMEOUT_MS,
    )
    try:
        kafka.init_transactions(producer, _FLUSH_S)
    except Exception as exc:
        _close(producer)
        raise kafka.to_error(exc, f"txbridge spark sink: fencing other drivers of batch {batch_id}") from exc
    return producer


def _close(producer: Any) -> None:
    try:
        producer.flush(0)
    except Exception as exc:  # a fenced producer may refuse; nothing of it is left to send
        logger.debug("closing the sink's decision producer: %s", exc)


def _write_decision(opts: SinkOptions, decision: BatchDecision, fence: Any) -> None:
    """The decision record, in a Kafka transaction of the sink's fencing producer.

    Raises:
        DriverFencedError: another driver of this sink initialised the fence since this one.
        KafkaOperationError: it was not committed.
    """
    what = f"the decision record of batch {decision.batch_id}"
    try:
        fence.begin_transaction()
        fence.produce(sink_topic(opts.namespace), key=decision.key, value=decision.encode(), partition=0)
        fence.commit_transaction(_FLUSH_S)
    except Exception as exc:
        error = kafka.to_error(exc, f"txbridge spark sink: {what}")
        if isinstance(error, ProducerFencedError) or "fenced" in str(error).lower():
            raise DriverFencedError(
                f"txbridge spark sink: another driver of sink {opts.sink_key} (a restart from the same "
                f"checkpoint, or the same sinkId) took over batch {decision.batch_id}; this driver wrote "
                "no decision and no op record: stop it, the other one decides the batch"
            ) from exc
        try:
            fence.abort_transaction(_FLUSH_S)
        except Exception as abort_exc:  # the broker aborts it after the transaction timeout anyway
            logger.warning("aborting %s: %s", what, abort_exc)
        raise error from exc


def write_ops(opts: SinkOptions, decisions: Sequence[tuple[TxRef, TxState]]) -> dict[int, int]:
    """One op record per ``(transaction, state)``, in order, each acknowledged. Returns the
    offset of the last one written to each op partition.

    Raises:
        KafkaOperationError: one was not acknowledged.
    """
    if not decisions:
        return {}
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
    return _produce_all(opts, records, "op records")


def _produce_all(
    opts: SinkOptions,
    records: Sequence[tuple[str, int, bytes, bytes | None]],
    what: str,
    producer: Any = None,
) -> dict[int, int]:
    """Produce ``records`` and wait for every acknowledgement; returns the highest offset
    acknowledged in each partition."""
    failures: list[str] = []
    last: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        elif msg is not None and msg.offset() is not None:
            last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())

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
    return last


def _pause(stage: str, batch_id: int) -> None:
    plan = os.environ.get(PAUSE_ENV, "")
    parts = plan.split(":", 2)
    if len(parts) == 3 and parts[0] == stage and parts[1] == str(batch_id):
        Path(parts[2]).write_text(f"{os.getpid()}\n")
        logger.warning("test hook %s: pausing at %s of batch %d", PAUSE_ENV, stage, batch_id)
        go = Path(f"{parts[2]}.go")
        deadline = time.monotonic() + 3600
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
