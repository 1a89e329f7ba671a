"""What one Kafka transaction of the coordinator carries. Pure: builds records, produces nothing.

A :class:`Batch` collects, between two commit boundaries, the records that must
become visible atomically with a partition's consumed offsets besides its
republished messages and ``<ns>_state`` entries: op records of back-check
verdicts and expiries, and quarantined input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

# The producer refuses, before the half record is written, what this size rule would quarantine.
from txbridge.limits import record_size
from txbridge.wire import (
    H_CHECKS,
    H_ORIGIN,
    H_REASON,
    HalfMessage,
    OpRecord,
    OpSource,
    Topics,
    TxState,
)

Headers = list[tuple[str, bytes]]


@dataclass(slots=True)  # not frozen: one per republished message, and a frozen __init__ costs 3x
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    partition: int | None = None  # None: the producer's partitioner, murmur2 of the key as in Java


def plan_republish(
    messages: Sequence[HalfMessage], max_message_bytes: int, partitions_of: Callable[[str], int | None]
) -> list[OutRecord] | str:
    """The real-topic records of a committed transaction in seq order, or why it cannot be republished.

    Args:
        messages: the transaction's messages (any order; sorted by seq here).
        max_message_bytes: the largest record the coordinator republishes.
        partitions_of: partition count of a topic, None when it does not exist.
    """
    out: list[OutRecord] = []
    for msg in messages if len(messages) == 1 else sorted(messages, key=lambda m: m.seq):
        headers = msg.republish_headers()
        size = record_size(msg.key, msg.value, headers)
        if size > max_message_bytes:
            return f"message seq {msg.seq} is {size} bytes, above max_message_bytes={max_message_bytes}"
        count = partitions_of(msg.topic)
        if count is None:
            return f"topic {msg.topic!r} does not exist"
        if msg.partition is not None and not 0 <= msg.partition < count:
            return f"topic {msg.topic!r} has no partition {msg.partition} (it has {count})"
        out.append(OutRecord(msg.topic, msg.key, msg.value, headers, msg.partition))
    return out


def copy_aside(
    topic: str, msg: HalfMessage, reason: str, origin: str, checks: int | None = None
) -> OutRecord:
    """A half record copied whole to ``<ns>_expired`` or ``<ns>_quarantine`` with the reason."""
    headers = [*msg.to_headers(), (H_REASON, reason.encode()), (H_ORIGIN, origin.encode())]
    if checks is not None:
        headers.append((H_CHECKS, str(checks).encode()))
    return OutRecord(topic, msg.record_key(), msg.value, headers)


def quarantine_raw(
    topic: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    reason: str,
    origin: str,
) -> OutRecord:
    """An unparseable record, kept whole, plus ``txb.reason`` and ``txb.origin``."""
    kept = [(n, v if v is not None else b"") for n, v in headers or ()]
    return OutRecord(topic, key, value, [*kept, (H_REASON, reason.encode()), (H_ORIGIN, origin.encode())])


class Batch:
    """Records for the next Kafka transaction of each partition (cleared once it commits or aborts).

    Each record belongs to the partition whose transaction carries it: an op record to the op
    partition it is written to, a quarantined input record to the partition it was read from.
    """

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self._records: dict[int, list[OutRecord]] = {}

    def __len__(self) -> int:
        return sum(len(r) for r in self._records.values())

    def partitions(self) -> set[int]:
        return {p for p, records in self._records.items() if records}

    def records_of(self, partition: int) -> list[OutRecord]:
        return self._records.get(partition, [])

    def add(self, partition: int, record: OutRecord) -> None:
        self._records.setdefault(partition, []).append(record)

    def op(
        self, partition: int, tx_id: str, state: TxState, source: OpSource, *, group: str, reason: str = ""
    ) -> None:
        """An op record (back-check verdict, expiry) to ``<ns>_op`` partition ``partition``."""
        key, value = OpRecord(tx_id, state, source, group=group, reason=reason).encode()
        self.add(partition, OutRecord(self.topics.op, key, value, [], partition))

    def clear(self, partitions: Iterable[int] | None = None) -> None:
        """Forget the records of ``partitions`` (None: of all)."""
        if partitions is None:
            self._records.clear()
            return
        for partition in partitions:
            self._records.pop(partition, None)
