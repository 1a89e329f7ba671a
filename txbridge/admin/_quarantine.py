"""``<ns>_quarantine`` listed, and its committed transactions re-driven through the coordinator.

The coordinator quarantines a committed transaction it cannot republish: copies of
its half records go to ``<ns>_quarantine`` with ``txb.reason`` and ``txb.origin``.
Some causes go away (the topic or partition is created, a size limit raised);
:func:`requeue` then writes the messages back as the half records of a *new*
transaction, decided COMMIT by an ``admin`` op record with its message count, on the
original half/op partition. The coordinator republishes it like any committed
transaction, or quarantines it again (listed as the requeue of the first).

A marker for the original tx id in ``<ns>_quarantine``, written in the same Kafka
transaction, makes the requeue happen once (see :mod:`txbridge.admin._once`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from txbridge.admin._once import REQUEUE, AlreadyDecidedError, Marker, decide_once, decode_marker
from txbridge.admin.side_topics import (
    Extra,
    as_dict,
    check_destinations,
    origin_of,
    original,
    produce,
    read_committed,
    reason_of,
)
from txbridge.errors import TxBridgeError, WireFormatError
from txbridge.kafka import Producer
from txbridge.wire import (
    DEFAULT_NAMESPACE,
    HalfMessage,
    OpRecord,
    OpSource,
    Topics,
    TxState,
    decode_half,
    half_partition,
    header_dict,
    new_tx_id,
)

#: Reasons the coordinator gives (coordinator/state/republisher.py, coordinator/commit/writer.py)
#: for causes that can go away: a missing topic or partition, a size limit, a message the client
#: or broker refused.
#: Any other reason (halves past retention, an incomplete transaction) never does, and
#: requeuing such a transaction would publish part of it.
_CURABLE_REASONS = (
    re.compile(r"^topic .+ does not exist$"),
    re.compile(r"^topic .+ has no partition -?\d+"),
    re.compile(r"^message seq \d+ is \d+ bytes, above max_message_bytes=\d+$"),
    re.compile(r"^the (producer refused|broker rejected) a message to "),
)


@dataclass
class Quarantined:
    """One entry of ``<ns>_quarantine``: a committed transaction's copies, or one raw record.

    Attributes:
        tx_id: the transaction (a raw record: its key as text).
        raw: an unparseable half or op record, kept whole; never requeueable.
        group: the producer group.
        reason: why the coordinator set it aside (``txb.reason``).
        origin: where the coordinator read it (``txb.origin``: ``<topic>/<partition>/<offset>``).
        partition: the partition ``origin`` names.
        quarantined_ms: when it was set aside (the copy's timestamp).
        messages: the transaction's messages, by seq.
        requeued: the admin's requeue of it, if any (``requeued.new_tx_id`` is the new transaction).
        requeue_of: the transaction this one requeued, when it is a requeue quarantined again.
    """

    tx_id: str
    raw: bool = False
    group: str = ""
    reason: str = ""
    origin: str = ""
    partition: int | None = None
    quarantined_ms: int = 0
    messages: list[HalfMessage] = field(default_factory=list)
    requeued: Marker | None = None
    requeue_of: str = ""

    @property
    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})

    def not_requeueable(self) -> str | None:
        """Why it cannot be requeued (None: it can)."""
        if self.raw:
            return "an unparseable record, not a transaction"
        if self.requeued is not None:
            return f"already {self.requeued.describe()}"
        if not any(pattern.search(self.reason) for pattern in _CURABLE_REASONS):
            return f"its cause does not go away ({self.reason})"
        seqs = [m.seq for m in self.messages]
        if seqs != list(range(len(seqs))):
            return f"its copies are incomplete (seqs {seqs})"
        return None

    def status(self) -> str:
        if self.raw:
            return "raw record, not requeueable"
        if self.requeued is not None:
            return self.requeued.describe()
        return "requeueable" if self.not_requeueable() is None else "not requeueable"


def list_quarantine(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None
) -> list[Quarantined]:
    """Every entry of ``<ns>_quarantine`` in the order it was set aside, with its requeues."""
    entries: list[Quarantined] = []
    by_tx: dict[str, Quarantined] = {}
    markers: dict[str, Marker] = {}
    for msg in read_committed(bootstrap, Topics(namespace).quarantine, extra=extra):
        marker = decode_marker(msg.headers(), msg.value())
        if marker is not None:
            markers.setdefault(marker.tx_id, marker)
            continue
        headers = header_dict(msg.headers())
        origin, partition, _offset = origin_of(headers)
        found = Quarantined("", reason=reason_of(headers), origin=origin, quarantined_ms=msg.timestamp()[1])
        try:
            half = decode_half(msg.value(), msg.headers())
        except WireFormatError:
            key = (msg.key() or b"").decode("utf-8", "replace")
            entries.append(replace(found, tx_id=key, raw=True))
            continue
        entry = by_tx.get(half.tx_id)
        if entry is None:
            entry = by_tx[half.tx_id] = replace(
                found, tx_id=half.tx_id, group=half.group, partition=partition
            )
            entries.append(entry)
        if all(m.seq != half.seq for m in entry.messages):
            entry.messages.append(original(half))
    requeue_of = {m.new_tx_id: m.tx_id for m in markers.values() if m.action == REQUEUE}
    for entry in by_tx.values():
        entry.messages.sort(key=lambda m: m.seq)
        entry.requeued = markers.get(entry.tx_id)
        entry.requeue_of = requeue_of.get(entry.tx_id, "")
    return entries


@dataclass(frozen=True)
class RequeueResult:
    """What one requeue did: the new transaction, or (``requeue_all``) why nothing was published."""

    tx_id: str
    new_tx_id: str = ""
    messages: int = 0
    error: str = ""


def requeue(
    bootstrap: str, tx_id: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None
) -> RequeueResult:
    """Re-drive a quarantined committed transaction through the coordinator, at most once.

    Its messages become the half records of a new transaction (same seqs, keys, values,
    headers, group) on the original half/op partition, followed by a COMMIT ``admin`` op
    record with the message count; one Kafka transaction carries them and the marker for
    ``tx_id`` in ``<ns>_quarantine``. The coordinator then republishes the new
    transaction, or quarantines it again if the cause is still there.

    Raises:
        TxBridgeError: not in ``<ns>_quarantine``, not requeueable, or a topic or partition is missing.
        AlreadyDecidedError: requeued before, or by another admin at the same time.
        KafkaOperationError: nothing was committed; the message says whether anything was published.
    """
    entries = list_quarantine(bootstrap, namespace, extra)
    entry = next((e for e in entries if e.tx_id == tx_id and not e.raw), None)
    if entry is None:
        where = Topics(namespace).quarantine
        if any(e.tx_id == tx_id for e in entries):
            raise TxBridgeError(
                f"{tx_id} is a raw record in {where}, not a transaction: it cannot be requeued"
            )
        raise TxBridgeError(f"transaction {tx_id} is not in {where}: see 'txbridge admin quarantine'")
    return _requeue(bootstrap, namespace, entry, extra)


def requeue_all(
    bootstrap: str, namespace: str = DEFAULT_NAMESPACE, extra: Extra = None
) -> list[RequeueResult]:
    """Requeue every requeueable quarantined transaction not requeued yet, each at most once.

    One that fails (say its topic is still missing) gets its error in its result; the others go on.
    """
    results = []
    for entry in list_quarantine(bootstrap, namespace, extra):
        if entry.not_requeueable() is not None:
            continue
        try:
            results.append(_requeue(bootstrap, namespace, entry, extra))
        except TxBridgeError as exc:
            results.append(RequeueResult(entry.tx_id, error=str(exc)))
    return results


def _requeue(bootstrap: str, namespace: str, entry: Quarantined, extra: Extra) -> RequeueResult:
    why_not = entry.not_requeueable()
    if entry.requeued is not None:
        raise AlreadyDecidedError(f"transaction {entry.tx_id} was {why_not} by an admin", entry.requeued)
    if why_not is not None:
        raise TxBridgeError(f"transaction {entry.tx_id} cannot be requeued: {why_not}")
    topics = Topics(namespace)
    metadata = check_destinations(bootstrap, entry.messages, extra)
    new_id = new_tx_id()
    partition = _partition(entry, new_id, len(metadata[topics.half].partitions))

    def write(producer: Producer) -> None:
        for msg in entry.messages:
            half = msg._replace(tx_id=new_id, check_after_s=None)
            produce(
                producer,
                topics.half,
                half.record_key(),
                half.value,
                headers=half.to_headers(),
                partition=partition,
            )
        key, value = OpRecord(
            new_id,
            TxState.COMMIT,
            OpSource.ADMIN,
            count=len(entry.messages),
            group=entry.group,
            reason=f"requeue of {entry.tx_id}",
        ).encode()
        produce(producer, topics.op, key, value, partition=partition)

    draft = Marker(entry.tx_id, REQUEUE, TxState.COMMIT, attempt="", new_tx_id=new_id)
    marker = decide_once(bootstrap, namespace, topics.quarantine, draft, write, extra=as_dict(extra))
    return RequeueResult(entry.tx_id, marker.new_tx_id, len(entry.messages))


def _partition(entry: Quarantined, new_id: str, partitions: int) -> int:
    """The original half/op partition, so the order key (an explicit one too) keeps its partition.

    Without a usable ``txb.origin``: the wire format's rule on the first key, else the new tx id.
    """
    if entry.partition is not None and 0 <= entry.partition < partitions:
        return entry.partition
    first = entry.messages[0]
    return half_partition(first.key if first.key is not None else new_id.encode(), partitions)
