"""Where txbridge's commit-to-visible time went in a demo run, order by order.

Every committed txbridge order that became visible is split at two timestamps on the run's
host clock (the demo's processes all run on one host), both written by Kafka or txbridge
and read back after the run:

=========  ==========================================================================
producer   the order's DB commit -> its op record's append time (``<ns>_op`` keeps
           LogAppendTime): the local transaction's end and the op record's produce
republish  op appended -> the republished record's CreateTime (the coordinator's
           ``produce()``): the coordinator's fetch of the op, and any wait for its turn
visible    CreateTime -> the read_committed watcher first received the order: the
           coordinator's Kafka commit and the watcher's fetch
=========  ==========================================================================

The orders fall into three kinds, each with its own figures:

- ``prompt``: decided by its producer (a COMMIT op record) and not held back;
- ``held_by_key``: an earlier order of the same customer (the message key) was republished
  only after this one's op record was appended: the coordinator keeps a key's order, so
  this one waited for it (typically for the back-check of an order whose outcome its
  producer never learned, or of a producer killed mid-transaction);
- ``back_checked``: decided by a back-check (its producer was killed after the DB commit),
  so its op record came from the coordinator, ``check_delay`` or more after the commit.

Native Kafka transactions hold nothing back (a killed producer's transaction is aborted and
its order is lost instead), so ``prompt`` is what to set beside native's figure.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_pipelines.percentiles import percentile
from spark_pipelines.store import CommittedOrder
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.wire import decode_ops

PARTS = ("producer", "republish", "visible")
KINDS = ("prompt", "held_by_key", "back_checked")


@dataclass(frozen=True)
class Republished:
    """What the read_committed watcher saw of an order first: when, and the record's stamps."""

    seen_ms: int
    created_ms: int
    tx_id: str


@dataclass(frozen=True)
class Decision:
    """An op record: when it was appended and who wrote it (``producer``, ``check``, ...)."""

    appended_ms: int
    source: str


def read_decisions(
    bootstrap: str,
    topic: str,
    partitions: int,
    extra: Mapping[str, Any] | None = None,
    *,
    timeout: float = 60.0,
) -> dict[str, Decision]:
    """tx id -> its first op record in ``topic`` (``<ns>_op``, ``partitions`` of them), read
    from the start to the end.

    Raises:
        KafkaOperationError: the topic could not be read to its end within ``timeout``.
    """
    consumer = kafka.consumer(bootstrap, f"latency-split-{uuid.uuid4().hex[:8]}", extra)
    decisions: dict[str, Decision] = {}
    try:
        ends = {}
        for p in range(partitions):
            _low, high = consumer.get_watermark_offsets(kafka.partition_at(topic, p), timeout=10)
            if high > 0:
                ends[p] = high
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in ends])
        for msg in kafka.read_to_end(consumer, topic, ends, timeout=timeout, what=f"reading {topic}"):
            appended = kafka.append_time_ms(msg)
            if appended is None:
                continue
            try:
                ops = decode_ops(msg.value())  # one decision, or a producer's batch of them
            except WireFormatError:
                continue  # a malformed op record: the coordinator quarantines it, nothing to time
            for op in ops:
                decisions.setdefault(op.tx_id, Decision(appended, op.source.value))
    finally:
        consumer.close()
    return decisions


def _quantiles(values: Sequence[int]) -> dict[str, float | None]:
    # The report table's percentile, so a kind's whole p50 reads like the table's p50.
    ordered = sorted(values)
    return {"p50": percentile(ordered, 0.5), "p99": percentile(ordered, 0.99)}


def split(
    committed: Iterable[CommittedOrder],
    republished: Mapping[str, Republished],
    decisions: Mapping[str, Decision],
) -> dict[str, Any]:
    """Per kind of order: how many, and p50/p99 (ms) of the whole and of each part.

    Orders that were not seen, or whose op record is not in ``decisions``, are counted in
    ``unsplit`` and left out of the figures.
    """
    by_customer: dict[str, list[CommittedOrder]] = {}
    for order in committed:
        by_customer.setdefault(order.customer_id, []).append(order)
    rows: dict[str, list[dict[str, int]]] = {kind: [] for kind in KINDS}
    unsplit = 0
    for orders in by_customer.values():
        published_before = 0  # the latest republish time of this customer's earlier orders
        for order in sorted(orders, key=lambda o: o.customer_seq):
            seen = republished.get(order.order_id)
            decision = decisions.get(seen.tx_id) if seen is not None else None
            if seen is None or decision is None:
                unsplit += 1
                continue
            if decision.source != "producer":
                kind = "back_checked"
            elif published_before > decision.appended_ms:
                kind = "held_by_key"
            else:
                kind = "prompt"
            published_before = max(published_before, seen.created_ms)
            rows[kind].append(
                {
                    "whole": seen.seen_ms - order.committed_ms,
                    "producer": decision.appended_ms - order.committed_ms,
                    "republish": seen.created_ms - decision.appended_ms,
                    "visible": seen.seen_ms - seen.created_ms,
                }
            )
    out: dict[str, Any] = {"unsplit": unsplit}
    for kind, samples in rows.items():
        out[kind] = {"orders": len(samples)} | {
            part: _quantiles([s[part] for s in samples]) for part in ("whole", *PARTS)
        }
    return out


def quantiles_text(q: Mapping[str, float | None]) -> str:
    """``p50 / p99`` of one part, in whole ms ("-" when no order had it)."""
    return "-" if q["p50"] is None else f"{q['p50']:.0f} / {q['p99']:.0f}"


def sentences(figures: Mapping[str, Any]) -> list[str]:
    """The split as the report prints it: one line per kind of order that occurred."""
    meaning = {
        "prompt": "decided by its producer, not held back",
        "held_by_key": "held for an earlier order of its customer",
        "back_checked": "decided by a back-check after its producer was killed",
    }
    ms = quantiles_text
    lines = []
    for kind in KINDS:
        f = figures.get(kind) or {}
        if not f.get("orders"):
            continue
        parts = ", ".join(f"{part} {ms(f[part])}" for part in PARTS)
        lines.append(f"{kind} ({meaning[kind]}): {f['orders']} orders, whole {ms(f['whole'])} ms ({parts})")
    return lines
