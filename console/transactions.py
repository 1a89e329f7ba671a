"""The rows of the transactions page, from what the SDK's admin functions read, and their search.

Pure: the pages hand it :func:`txbridge.admin.list_pending`'s entries, :class:`~txbridge.admin.ExpiredTx`
and :class:`~txbridge.admin.Quarantined` values; tests hand it the same without a broker. Keys,
topics and headers are the users' data: they are kept as text here and escaped where rendered.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txbridge.admin import ExpiredTx, Quarantined
from txbridge.wire import HalfMessage

__all__ = [
    "ExpiredRow",
    "MessageRow",
    "PendingRow",
    "QuarantinedRow",
    "expired_rows",
    "pending_by_group",
    "pending_rows",
    "quarantined_rows",
]

#: Characters of a header value shown; the rest is cut (a page is not the place for payloads).
HEADER_CHARS = 120


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


@dataclass(frozen=True)
class MessageRow:
    seq: int
    topic: str
    key: str | None
    partition: int | None
    value_bytes: int | None
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, msg: HalfMessage) -> MessageRow:
        headers = tuple(
            (name, (_text(value) or "")[:HEADER_CHARS]) for name, value in msg.user_headers if name
        )
        return cls(
            msg.seq,
            msg.topic,
            _text(msg.key),
            msg.partition,
            None if msg.value is None else len(msg.value),
            headers,
        )


@dataclass(frozen=True)
class PendingRow:
    """A pending transaction and what ``<ns>_state`` holds of its back-checks."""

    tx_id: str
    group: str
    partition: int | None
    phase: str
    checks: int
    first_ms: int | None  # its first half's append time
    next_check_ms: int | None
    unasked_ms: int | None  # since when no check could be sent
    problem: str
    halves: int
    topics: tuple[str, ...]
    keys: tuple[str, ...]

    def age_s(self, now_ms: int) -> float | None:
        return None if self.first_ms is None else max(0.0, (now_ms - self.first_ms) / 1000)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _half_key(half: Sequence[Any]) -> str | None:
    """The key of a state entry's half (``[seq, offset, size, topic, base64 key]``)."""
    if len(half) < 5 or not isinstance(half[4], str):
        return None
    try:
        return base64.b64decode(half[4], validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return None


def pending_rows(entries: Iterable[Mapping[str, Any]]) -> list[PendingRow]:
    """Rows of :func:`txbridge.admin.list_pending`'s entries, oldest first."""
    rows = []
    for e in entries:
        halves = [h for h in e.get("halves", []) if isinstance(h, list)]
        topics = sorted({str(h[3]) for h in halves if len(h) > 3})
        keys = sorted({k for k in (_half_key(h) for h in halves) if k is not None})
        rows.append(
            PendingRow(
                tx_id=str(e.get("tx", "")),
                group=str(e.get("group", "")),
                partition=_int(e.get("p")),
                phase=str(e.get("phase", "")),
                checks=_int(e.get("checks")) or 0,
                first_ms=_int(e.get("first")),
                next_check_ms=_int(e.get("next")),
                unasked_ms=_int(e.get("unasked")),
                problem=str(e.get("problem", "")),
                halves=len(halves),
                topics=tuple(topics),
                keys=tuple(keys),
            )
        )
    return sorted(rows, key=lambda r: (r.first_ms is None, r.first_ms or 0, r.tx_id))


def pending_by_group(rows: Iterable[PendingRow]) -> list[tuple[str, list[PendingRow]]]:
    """Rows by producer group (groups by name), each group's oldest first."""
    groups: dict[str, list[PendingRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return sorted(groups.items())


@dataclass(frozen=True)
class ExpiredRow:
    tx_id: str
    group: str
    checks: int
    reason: str
    partition: int | None
    messages: tuple[MessageRow, ...]
    decision: str | None  # "resolved COMMIT" once an admin decided
    decided_ms: int | None

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})


def expired_rows(entries: Iterable[ExpiredTx]) -> list[ExpiredRow]:
    return [
        ExpiredRow(
            tx_id=e.tx_id,
            group=e.group,
            checks=e.checks,
            reason=e.reason,
            partition=e.partition,
            messages=tuple(MessageRow.of(m) for m in e.messages),
            decision=e.resolved.describe() if e.resolved is not None else None,
            decided_ms=(e.resolved.timestamp_ms or None) if e.resolved is not None else None,
        )
        for e in entries
    ]


@dataclass(frozen=True)
class QuarantinedRow:
    tx_id: str
    raw: bool
    group: str
    reason: str
    origin: str
    quarantined_ms: int
    messages: tuple[MessageRow, ...]
    status: str
    requeueable: bool
    requeue_of: str

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})


def quarantined_rows(entries: Iterable[Quarantined]) -> list[QuarantinedRow]:
    return [
        QuarantinedRow(
            tx_id=e.tx_id,
            raw=e.raw,
            group=e.group,
            reason=e.reason,
            origin=e.origin,
            quarantined_ms=e.quarantined_ms,
            messages=tuple(MessageRow.of(m) for m in e.messages),
            status=e.status(),
            requeueable=e.not_requeueable() is None,
            requeue_of=e.requeue_of,
        )
        for e in entries
    ]


def matches(query: str, tx_id: str, topics: Iterable[str], keys: Iterable[str | None]) -> bool:
    """Whether a row answers ``query``: a part of its tx id, or one of its topics or keys exactly
    or in part (case-insensitive). An empty query matches everything."""
    wanted = query.strip().lower()
    if not wanted:
        return True
    texts = [tx_id, *topics, *(k for k in keys if k is not None)]
    return any(wanted in text.lower() for text in texts)


def search_pending(rows: Iterable[PendingRow], query: str) -> list[PendingRow]:
    return [r for r in rows if matches(query, r.tx_id, r.topics, r.keys)]


def search_expired(rows: Iterable[ExpiredRow], query: str) -> list[ExpiredRow]:
    return [r for r in rows if matches(query, r.tx_id, r.topics, (m.key for m in r.messages))]


def search_quarantined(rows: Iterable[QuarantinedRow], query: str) -> list[QuarantinedRow]:
    return [
        r for r in rows if matches(query, r.tx_id, r.topics, [m.key for m in r.messages] + [r.requeue_of])
    ]
