"""Half payloads: a byte budget for the cached ones, and re-reading evicted ones by offset."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from coordinator.state.partition import HalfRef, PartitionState, PendingTx
from txbridge import kafka
from txbridge.errors import KafkaOperationError, WireFormatError
from txbridge.kafka import Consumer
from txbridge.wire import HalfMessage, decode_half

logger = logging.getLogger(__name__)


def evict(txs: Iterable[PendingTx], budget_bytes: int) -> int:
    """Drop cached payloads, oldest transactions first, until the rest fit ``budget_bytes``.

    Sums every transaction's cached bytes; :func:`evict_states` uses the states' running
    totals instead. Returns how many bytes were evicted.
    """
    txs = list(txs)
    total = sum(t.cached_bytes() for t in txs)
    if total <= budget_bytes:
        return 0
    return _drop_oldest(txs, total, budget_bytes)


def evict_states(states: Iterable[PartitionState], budget_bytes: int) -> int:
    """Keep the cached payloads of ``states`` within ``budget_bytes``, oldest transactions first.

    Under budget this costs one addition per partition. Over it, payloads are dropped
    until the rest fit 7/8 of the budget, so the sort of the pending transactions runs
    once per eighth of the budget of new payloads, not at every commit boundary.
    Returns how many bytes were evicted.
    """
    states = list(states)
    total = sum(s.payload_bytes for s in states)
    if total <= budget_bytes:
        return 0  # the common case, every commit boundary
    cached = [t for s in states for t in s.pending.values() if t.cached_bytes()]
    return _drop_oldest(cached, total, budget_bytes - budget_bytes // 8)


def _drop_oldest(txs: list[PendingTx], total: int, target: int) -> int:
    evicted = 0
    for tx in sorted(txs, key=lambda t: (t.first_append_ms or 0, t.tx_id)):
        if total - evicted <= target:
            break
        evicted += tx.drop_payloads()
    return evicted


def record_size(msg: Any) -> int:
    """What a consumed half record counts against the payload budget: value and headers."""
    return headers_size(msg.value(), msg.headers())


def headers_size(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """:func:`record_size` of a record's value and headers already read from it (each
    ``headers()`` call builds the list anew)."""
    size = len(value) if value else 0
    for name, raw in headers or ():
        size += len(name) + (len(raw) if raw else 0)
    return size


class HalfRecord(NamedTuple):
    """A half record read back: the message, its size as the state counts it, its append time."""

    message: HalfMessage
    size: int
    append_ms: int | None  # None when the half topic keeps CreateTime


class HalfReader:
    """Re-reads half records by offset (evicted payloads, restored transactions)."""

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, Any] | None = None) -> None:
        self._bootstrap, self._topic, self._extra = bootstrap, topic, extra
        self._consumer: Consumer | None = None

    def load(self, txs: Iterable[PendingTx], timeout: float = 30.0) -> None:
        """Fill in ``message`` of every half of ``txs`` whose payload is missing.

        A record the reader skipped past (deleted by retention) stays missing; the caller decides.

        Raises:
            KafkaOperationError: a record could not be read back in time (e.g. retention deleted it).
        """
        wanted: dict[int, dict[int, tuple[PendingTx, HalfRef]]] = {}
        for tx in txs:
            for ref in tx.ordered_halves():
                if ref.message is None:
                    wanted.setdefault(tx.partition, {})[ref.offset] = (tx, ref)
        for partition, refs in wanted.items():
            for offset, record in self.read(partition, sorted(refs), timeout).items():
                tx, ref = refs[offset]
                tx.set_payload(ref, record.message)

    def read(self, partition: int, offsets: list[int], timeout: float = 30.0) -> dict[int, HalfRecord]:
        """The half records at ``offsets`` (sorted) of ``partition``; deleted ones are absent.

        Raises:
            KafkaOperationError: a record could not be read back in time, or no longer parses.
        """
        if not offsets:
            return {}
        if self._consumer is None:
            # A short fetch wait: a re-read sits on the commit path, the records are already there.
            self._consumer = kafka.consumer(
                self._bootstrap,
                f"txbridge-halfreader-{uuid.uuid4().hex[:8]}",
                self._extra,
                fetch_wait_max_ms=10,
            )
        want = set(offsets)
        found: dict[int, HalfRecord] = {}
        self._consumer.assign([kafka.partition_at(self._topic, partition, offsets[0])])
        deadline = time.monotonic() + timeout
        reached = -1  # the highest offset read so far
        try:
            while want - found.keys() and reached < offsets[-1]:
                if time.monotonic() > deadline:
                    missing = sorted(want - found.keys())[:5]
                    raise KafkaOperationError(
                        f"half records {self._topic}/{partition} at {missing} could not be read back"
                    )
                for msg in kafka.consume_available(self._consumer, 500, 0.5):
                    if msg.error() is not None:
                        continue
                    reached = max(reached, msg.offset())
                    if msg.offset() not in want:
                        continue
                    try:
                        message = decode_half(msg.value(), msg.headers())
                    except WireFormatError as exc:  # it parsed when first read; this is a real fault
                        raise KafkaOperationError(
                            f"half record {msg.offset()} no longer parses: {exc}"
                        ) from exc
                    found[msg.offset()] = HalfRecord(message, record_size(msg), kafka.append_time_ms(msg))
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
