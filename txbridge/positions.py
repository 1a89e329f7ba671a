"""Where the coordinators' commits leave each partition of a namespace: the committed offsets of
the namespace's positions group.

Every coordinator commit sends, inside its Kafka transaction, the next half and op offset of each
partition it covers (``send_offsets_to_transaction``, the shape of KIP-447), the half offset's
metadata listing the partition's young transactions (:func:`txbridge.wire.encode_young`). The
group is bound to the namespace, not to the coordinators' consumer group: an operator may rename
that one, and positions under the old name would be lost. No member ever joins it.

Offsets sent in a transaction are part of it: committed with its records or discarded with them.
:func:`read` asks for stable offsets (``require_stable``), so an offset still pending in an open
transaction is never read: the broker answers UNSTABLE_OFFSET_COMMIT until that transaction ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import AdminClient, Consumer, KafkaError, TopicPartition
from txbridge.wire import Positions, Topics

#: How soon a read answered UNSTABLE_OFFSET_COMMIT asks again.
_UNSTABLE_AGAIN_S = 0.02


def group(namespace: str) -> str:
    """The positions group of ``namespace`` (``txbridge-positions.<namespace>``)."""
    return f"txbridge-positions.{namespace}"


def consumer(bootstrap: str, namespace: str, extra: Mapping[str, Any] | None = None) -> Consumer:
    """A client of the positions group that never subscribes: its group metadata is what a
    transaction's ``send_offsets_to_transaction`` names (:func:`read` reads the offsets)."""
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
    """The positions in the committed offsets read of ``wanted(...)``; a
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


def read(client: AdminClient, topics: Topics, numbers: Iterable[int], timeout: float) -> dict[int, Positions]:
    """The committed positions of ``numbers`` (absent: none committed), stable ones only: while a
    coordinator's transaction holds one open (UNSTABLE_OFFSET_COMMIT, milliseconds), asked again.

    Raises:
        KafkaOperationError: the group's or a partition's error (GROUP_AUTHORIZATION_FAILED
            without the ACL), still unstable at ``timeout``, or no answer within it.
    """
    partitions = wanted(topics, numbers)
    if not partitions:
        return {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = max(deadline - time.monotonic(), 0.1)
            committed = kafka.committed_offsets(client, group(topics.namespace), partitions, timeout=left)
            return from_committed(topics, committed)
        except KafkaOperationError as exc:
            if exc.code != KafkaError.UNSTABLE_OFFSET_COMMIT or time.monotonic() > deadline:
                raise
            time.sleep(_UNSTABLE_AGAIN_S)
