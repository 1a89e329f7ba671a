"""Where the coordinators' commits leave each partition of a namespace: the committed offsets of
the namespace's positions group.

Every coordinator commit sends, inside its Kafka transaction, the next half and op offset of each
partition it covers (``send_offsets_to_transaction``, the shape of KIP-447), the half offset's
metadata listing the partition's young transactions (:func:`txbridge.wire.encode_young`). The
group is bound to the namespace, not to the coordinators' consumer group: an operator may rename
that one, and positions under the old name would be lost. No member ever joins it.

Offsets sent in a transaction are part of it: committed with its records or discarded with them.
A read_committed client asks for stable offsets (librdkafka sets ``require_stable``), so an
offset still pending in an open transaction is never read; the broker answers
UNSTABLE_OFFSET_COMMIT until that transaction ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from txbridge import kafka
from txbridge.kafka import Consumer, TopicPartition
from txbridge.wire import Positions, Topics


def group(namespace: str) -> str:
    """The positions group of ``namespace`` (``txbridge-positions.<namespace>``)."""
    return f"txbridge-positions.{namespace}"


def consumer(bootstrap: str, namespace: str, extra: Mapping[str, Any] | None = None) -> Consumer:
    """A read_committed client of the positions group that never subscribes: it reads the
    group's committed offsets (stable ones only) and gives its metadata to a transaction."""
    return kafka.consumer(bootstrap, group(namespace), extra)


def offsets(topics: Topics, number: int, where: Positions) -> list[TopicPartition]:
    """What partition ``number``'s commit sends to the positions group (nothing for an offset
    that is None: that topic's partition was never consumed)."""
    out = []
    if where.half is not None:
        out.append(TopicPartition(topics.half, number, where.half, where.young))
    if where.op is not None:
        out.append(TopicPartition(topics.op, number, where.op))
    return out


def wanted(topics: Topics, numbers: Iterable[int]) -> list[TopicPartition]:
    """The half and op partitions of ``numbers``, for :func:`from_committed`'s read."""
    return [kafka.partition_at(t, n) for n in numbers for t in (topics.half, topics.op)]


def from_committed(topics: Topics, committed: Iterable[TopicPartition]) -> dict[int, Positions]:
    """The positions in the committed offsets ``Consumer.committed(wanted(...))`` answered; a
    partition with neither a half nor an op offset is absent (no coordinator committed it)."""
    half: dict[int, tuple[int, str]] = {}
    op: dict[int, int] = {}
    for tp in committed:
        if tp.offset < 0:
            continue
        if tp.topic == topics.half:
            half[tp.partition] = (tp.offset, tp.metadata or "")
        elif tp.topic == topics.op:
            op[tp.partition] = tp.offset
    return {
        n: Positions(half[n][0] if n in half else None, op.get(n), half[n][1] if n in half else "")
        for n in sorted(half.keys() | op.keys())
    }


def read(client: Consumer, topics: Topics, numbers: Iterable[int], timeout: float) -> dict[int, Positions]:
    """The committed positions of ``numbers`` (absent: none committed), read with ``client``
    (:func:`consumer`).

    Raises:
        KafkaException: not answered within ``timeout`` (UNSTABLE_OFFSET_COMMIT while a
            transaction holds one of them open, or no group coordinator).
    """
    partitions = wanted(topics, numbers)
    if not partitions:
        return {}
    return from_committed(topics, client.committed(partitions, timeout=timeout))
