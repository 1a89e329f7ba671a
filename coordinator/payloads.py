"""Half payloads: a byte budget for the cached ones, and re-reading evicted ones by offset."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.state import PendingTx
from txbridge import _kafka
from txbridge.errors import KafkaOperationError, WireFormatError
from txbridge.wire import HalfMessage, decode_half

logger = logging.getLogger(__name__)


def evict(txs: Iterable[PendingTx], budget_bytes: int) -> int:
    """Drop cached payloads, oldest transactions first, until the rest fit ``budget_bytes``.

    Returns how many bytes were evicted.
    """
    txs = list(txs)
    total = sum(t.cached_bytes() for t in txs)
    if total <= budget_bytes:
        return 0  # the common case, every commit boundary: no sort
    ordered = sorted(txs, key=lambda t: (t.first_append_ms or 0, t.tx_id))
    evicted = 0
    for tx in ordered:
        if total <= budget_bytes:
            break
        for ref in tx.halves.values():
            if ref.message is not None:
                ref.message = None
                total -= ref.size
                evicted += ref.size
    return evicted


class HalfReader:
    """Re-reads half records by offset (evicted payloads, restored transactions)."""

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, Any] | None = None) -> None:
        self._bootstrap, self._topic, self._extra = bootstrap, topic, extra
        self._consumer: Any = None

    def load(self, txs: Iterable[PendingTx], timeout: float = 30.0) -> None:
        """Fill in ``message`` of every half of ``txs`` whose payload is missing.

        A record the reader skipped past (deleted by retention) stays missing; the caller decides.

        Raises:
            KafkaOperationError: a record could not be read back in time (e.g. retention deleted it).
        """
        wanted: dict[int, dict[int, Any]] = {}
        for tx in txs:
            for ref in tx.halves.values():
                if ref.message is None:
                    wanted.setdefault(tx.partition, {})[ref.offset] = ref
        for partition, refs in wanted.items():
            for offset, message in self._read(partition, sorted(refs), timeout).items():
                refs[offset].message = message

    def _read(self, partition: int, offsets: list[int], timeout: float) -> dict[int, HalfMessage]:
        if self._consumer is None:
            # A short fetch wait: a re-read sits on the commit path, the records are already there.
            self._consumer = _kafka.consumer(
                self._bootstrap,
                f"txbridge-halfreader-{uuid.uuid4().hex[:8]}",
                self._extra,
                fetch_wait_max_ms=10,
            )
        want = set(offsets)
        found: dict[int, HalfMessage] = {}
        self._consumer.assign([_kafka.partition_at(self._topic, partition, offsets[0])])
        deadline = time.monotonic() + timeout
        reached = -1  # the highest offset read so far
        try:
            while want - found.keys() and reached < offsets[-1]:
                if time.monotonic() > deadline:
                    missing = sorted(want - found.keys())[:5]
                    raise KafkaOperationError(
                        f"half records {self._topic}/{partition} at {missing} could not be read back"
                    )
                for msg in self._consumer.consume(500, 0.5):
                    if msg.error() is not None:
                        continue
                    reached = max(reached, msg.offset())
                    if msg.offset() not in want:
                        continue
                    try:
                        found[msg.offset()] = decode_half(msg.value(), msg.headers())
                    except WireFormatError as exc:  # it parsed when first read; this is a real fault
                        raise KafkaOperationError(
                            f"half record {msg.offset()} no longer parses: {exc}"
                        ) from exc
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
