"""The Spark sink's pure parts: batch labels, decision records, the back-check resolver, chunking.

A *decision record* says which transactions of one micro-batch of one sink are the batch's
published ones. It is written once per (sink, batch), before any COMMIT op of the batch, to
the compacted topic ``<ns>_spark_sink`` keyed ``"<sink key>/<batch id>"``: the commit point
of the batch. :class:`DecisionBook` answers back-checks from these records.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from txbridge import limits
from txbridge.transaction import LocalTransaction, Message
from txbridge.wire import Topics, TxState

#: The header every message of the sink carries: ``"<sink key>/<batch id>"``.
H_BATCH = "txb.spark.batch"
#: The decision records' format version.
DECISION_VERSION = 1
#: Seconds a decision record must have been known before a back-check answers COMMIT from it.
DEFAULT_COMMIT_GRACE_S = 10.0


def sink_topic(namespace: str) -> str:
    """The compacted topic of the sink's decision records."""
    return Topics(namespace).spark_sink


def batch_label(sink_key: str, batch_id: int) -> str:
    """The value of :data:`H_BATCH` (and the decision record's key)."""
    return f"{sink_key}/{batch_id}"


def parse_label(label: str) -> tuple[str, int] | None:
    """``(sink key, batch id)`` of a label, None when it is not one."""
    sink, sep, batch = label.rpartition("/")
    if not sep or not sink or not batch.isdigit():
        return None
    return sink, int(batch)


@dataclass(frozen=True)
class TxRef:
    """One transaction a task wrote: its id, its half/op partition, its message count."""

    tx_id: str
    partition: int
    count: int


@dataclass(frozen=True)
class BatchDecision:
    """The transactions published for one batch of one sink, in the order their COMMITs go out."""

    sink_key: str
    batch_id: int
    txs: tuple[TxRef, ...]
    sink_id: str = ""

    @property
    def key(self) -> bytes:
        return batch_label(self.sink_key, self.batch_id).encode()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": DECISION_VERSION,
                "sink": self.sink_id,
                "sink_key": self.sink_key,
                "batch": self.batch_id,
                "txs": [[t.tx_id, t.partition, t.count] for t in self.txs],
                "ts": int(time.time() * 1000),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> BatchDecision:
        """Raises ValueError (or KeyError, TypeError) on a record that is not a decision."""
        data = json.loads(value)
        if data.get("v") != DECISION_VERSION:
            raise ValueError(f"decision record version {data.get('v')!r} is not {DECISION_VERSION}")
        txs = tuple(TxRef(str(t), int(p), int(n)) for t, p, n in data["txs"])
        return cls(str(data["sink_key"]), int(data["batch"]), txs, str(data.get("sink", "")))


@dataclass(frozen=True)
class JournalEntry:
    """A transaction a task attempt is about to write, recorded before its half records.

    The driver rolls back every journaled transaction of a batch that its decision does not
    list *before* it writes the batch's COMMITs: a dead attempt's (or a superseded run's)
    undecided transactions would otherwise hold only some of the retry's transactions in the
    coordinator (it orders transactions by their first message's key), and the others would
    overtake them. Keyed ``"<label>/j/<partition id>/<attempt>/<tx id>"``; the driver writes
    tombstones for them once the batch is decided.
    """

    sink_key: str
    batch_id: int
    tx_id: str
    partition: int
    task: str = ""  # "<partition id>/<attempt>"
    check_url: str = ""  # the writing driver's SinkChecks: it alone answers RUNNING for it

    @property
    def key(self) -> bytes:
        return f"{batch_label(self.sink_key, self.batch_id)}/j/{self.task}/{self.tx_id}".encode()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": DECISION_VERSION,
                "kind": "journal",
                "sink_key": self.sink_key,
                "batch": self.batch_id,
                "tx": self.tx_id,
                "p": self.partition,
                "task": self.task,
                "url": self.check_url,
            },
            separators=(",", ":"),
        ).encode()


def decode_record(value: bytes | None) -> BatchDecision | JournalEntry | None:
    """A record of ``<ns>_spark_sink``: a decision, a journal entry, or None (a tombstone, or
    something else)."""
    if value is None:
        return None
    try:
        data = json.loads(value)
        if data.get("kind") == "journal":
            return JournalEntry(
                str(data["sink_key"]),
                int(data["batch"]),
                str(data["tx"]),
                int(data["p"]),
                str(data["task"]),
                str(data.get("url", "")),
            )
        return BatchDecision.decode(value)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def journal_tx_of(key: bytes | None) -> str | None:
    """The tx id a journal entry's key names (for its tombstone), None for any other key."""
    text = (key or b"").decode("utf-8", "replace")
    head, sep, tx_id = text.rpartition("/")
    return tx_id if sep and "/j/" in head and tx_id else None


def ordered_refs(messages: Iterable[Sequence[TxRef] | None]) -> list[TxRef]:
    """The transactions of the tasks' commit messages, task by task, each task's in order
    (a failed task's message is None)."""
    return [ref for refs in messages if refs for ref in refs]


class DecisionBook:
    """The decision records read so far, and the back-check answer they give.

    A transaction of batch ``b`` of sink ``s`` (its messages' :data:`H_BATCH` header):

    - listed in the decision of ``(s, b)``: COMMIT, once the book has known the record for
      ``commit_grace_s`` (UNKNOWN before: the driver's own COMMITs, written in order right
      after the record, come first; a check's COMMIT could decide a later transaction of the
      task before an earlier one, and the coordinator would publish it first);
    - ``(s, b)`` decided without it, or a later batch of ``s`` decided (so ``b`` was decided,
      or will never be by this sink's run): ROLLBACK, a failed task attempt or a superseded run;
    - otherwise the batch is still being written or committed: RUNNING when a task of *this*
      driver journaled the transaction (its journal entry names one of :attr:`own_urls`, the
      URLs this book answers at), so the coordinator waits for the driver without using up
      its ``max_checks``, however long the batch takes; UNKNOWN for anyone else's (this
      driver cannot vouch that its writer lives: a driver gone for good leaves its undecided
      transactions to expire, a rollback). UNKNOWN too until the book has read every record
      the topic had when it started (:attr:`loaded`), and for a transaction without the
      header (not the sink's).
    """

    def __init__(self, commit_grace_s: float = DEFAULT_COMMIT_GRACE_S, clock: Any = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._decided: dict[tuple[str, int], frozenset[str]] = {}
        self._seen: dict[tuple[str, int], float] = {}
        self._newest: dict[str, int] = {}
        self._journal: dict[str, tuple[str, int, str]] = {}  # tx id -> (sink, batch, check URL)
        self.own_urls: set[str] = set()
        self.loaded = threading.Event()
        self.commit_grace_s = commit_grace_s
        self._clock = clock

    def add(self, decision: BatchDecision) -> None:
        """Note a decision record. A second record for the same batch is ignored (the first is final)."""
        key = (decision.sink_key, decision.batch_id)
        with self._lock:
            if key not in self._decided:
                self._decided[key] = frozenset(t.tx_id for t in decision.txs)
                self._seen[key] = self._clock()
            self._newest[decision.sink_key] = max(self._newest.get(decision.sink_key, -1), decision.batch_id)
            # Older batches' entries can no longer make an answer RUNNING (the batch's own stay for
            # the grace period; its tombstones drop them).
            newest = self._newest[decision.sink_key]
            self._journal = {
                tx: j for tx, j in self._journal.items() if j[0] != decision.sink_key or j[1] >= newest
            }

    def _open(self, sink_key: str, batch_id: int) -> bool:
        return (sink_key, batch_id) not in self._decided and batch_id >= self._newest.get(sink_key, -1)

    def note_journal(self, entry: JournalEntry) -> None:
        """Note a journal entry: a task attempt wrote (or is writing) ``entry.tx_id``."""
        with self._lock:
            if entry.check_url and self._open(entry.sink_key, entry.batch_id):
                self._journal[entry.tx_id] = (entry.sink_key, entry.batch_id, entry.check_url)

    def forget_journal(self, tx_id: str) -> None:
        """A journal entry's tombstone: its batch was decided."""
        with self._lock:
            self._journal.pop(tx_id, None)

    def decided(self, sink_key: str, batch_id: int) -> frozenset[str] | None:
        with self._lock:
            return self._decided.get((sink_key, batch_id))

    def answer(self, label: str | None, tx_id: str) -> TxState:
        """The verdict on ``tx_id`` whose messages carry ``label``."""
        parsed = parse_label(label) if label else None
        if parsed is None or not self.loaded.is_set():
            return TxState.UNKNOWN
        sink, batch = parsed
        with self._lock:
            chosen = self._decided.get((sink, batch))
            seen = self._seen.get((sink, batch), 0.0)
            newest = self._newest.get(sink, -1)
            journaled = self._journal.get(tx_id)
            ours = journaled is not None and journaled[:2] == (sink, batch) and journaled[2] in self.own_urls
        waiting = TxState.RUNNING if ours else TxState.UNKNOWN
        if chosen is not None:
            if tx_id not in chosen:
                return TxState.ROLLBACK
            # The driver writes the batch's COMMITs in order right after the record; a COMMIT from
            # a check now could decide a later transaction first and let it overtake an earlier one.
            return TxState.COMMIT if self._clock() - seen >= self.commit_grace_s else waiting
        return TxState.ROLLBACK if batch < newest else waiting

    def check(self, txn: LocalTransaction) -> TxState:
        """A txbridge check function: the verdict from the transaction's :data:`H_BATCH` header."""
        return self.answer(label_of(txn.messages), txn.tx_id)


def label_of(messages: Iterable[Message]) -> str | None:
    """The :data:`H_BATCH` value of the first message that has one."""
    for msg in messages:
        for name, raw in msg.header_pairs:
            if name == H_BATCH:
                return raw.decode("utf-8", "replace")
    return None


def chunks(messages: Iterable[Message], max_rows: int, max_bytes: int) -> Iterator[list[Message]]:
    """``messages`` in order, cut into transactions of at most ``max_rows`` messages and
    ``max_bytes`` bytes (:func:`txbridge.limits.record_size` of each, as republished; a single
    larger message is a transaction of its own)."""
    if max_rows < 1 or max_bytes < 1:
        raise ValueError("max_rows and max_bytes must be positive")
    chunk: list[Message] = []
    size = 0
    for msg in messages:
        raw_key = msg.key if isinstance(msg.key, bytes) or msg.key is None else str(msg.key).encode()
        raw_value = (
            msg.value if isinstance(msg.value, bytes) or msg.value is None else str(msg.value).encode()
        )
        this = limits.record_size(raw_key, raw_value, msg.header_pairs)
        if chunk and (len(chunk) >= max_rows or size + this > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(msg)
        size += this
    if chunk:
        yield chunk
