"""The txbridge wire format, version 1: what producers, coordinators and tools exchange.

``docs/wire-format.md`` is the same contract in prose, for clients in other
languages. This module is pure: no I/O, so every rule here is unit-tested.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from txbridge.errors import SignatureError, WireFormatError

VERSION = 1
DEFAULT_NAMESPACE = "__txbridge"
#: The default namespace's coordinators' consumer group unless they are given another
#: (``coordinator --group-id``); other namespaces: :func:`default_coordinator_group`.
DEFAULT_COORDINATOR_GROUP = "txbridge-coordinator"
DEFAULT_PARTITIONS = 12


def default_coordinator_group(namespace: str) -> str:
    """The consumer group of ``namespace``'s coordinators when they are given none.

    ``txbridge-coordinator`` for the default namespace, ``txbridge-coordinator.<namespace>``
    for any other: coordinators of two namespaces never share a group, so one host may run
    both under one instance id (a static member's ``group.instance.id`` is unique per group
    only).
    """
    if namespace == DEFAULT_NAMESPACE:
        return DEFAULT_COORDINATOR_GROUP
    return f"{DEFAULT_COORDINATOR_GROUP}.{namespace}"


def partition_transactional_id(namespace: str, partition: int) -> str:
    """The transactional.id under which an older txbridge committed partition ``partition`` of
    ``namespace`` (one id per partition). A coordinator taking over a partition that has no
    claim record yet fences it (docs/DESIGN.md, "Ownership": the upgrade)."""
    return f"{namespace}-partition-{partition}"


def coordinator_transactional_prefix(namespace: str) -> str:
    """The prefix of every coordinator's transactional.id in ``namespace``: each incarnation
    commits under ``<prefix><instance id>-<random hex>``, a name never used twice, recorded in
    the claim records of the partitions it takes (:class:`OwnerRecord`)."""
    return f"{namespace}-coord-"


def coordinator_transactional_id(namespace: str, instance_id: str) -> str:
    """A fresh transactional.id for one incarnation of coordinator ``instance_id``."""
    return f"{coordinator_transactional_prefix(namespace)}{instance_id}-{secrets.token_hex(6)}"


# ---------------------------------------------------------------- headers of a half record
H_VERSION = "txb.v"
H_TX = "txb.tx"
H_SEQ = "txb.seq"
H_TOPIC = "txb.topic"
H_PARTITION = "txb.partition"
H_KEY = "txb.key"
H_GROUP = "txb.group"
H_INSTANCE = "txb.instance"
H_TS = "txb.ts"
H_CHECK_AFTER = "txb.check_after"
H_NULL = "txb.null"  # present ("1") when the original value is null (a tombstone)
#: The source of truth the writer's check answers from (:func:`can_answer`); absent on halves
#: written before it existed.
H_SOURCE = "txb.source"

#: Protocol headers: stripped on republish, except ``txb.tx`` which the real
#: topic keeps so consumers and audits can tie a message to its transaction.
PROTOCOL_HEADERS = frozenset(
    {
        H_VERSION,
        H_SEQ,
        H_TOPIC,
        H_PARTITION,
        H_KEY,
        H_GROUP,
        H_INSTANCE,
        H_TS,
        H_CHECK_AFTER,
        H_NULL,
        H_SOURCE,
    }
)
REQUIRED_HALF_HEADERS = (H_VERSION, H_TX, H_SEQ, H_TOPIC, H_GROUP, H_INSTANCE)
_REQUIRED_HALF = frozenset(REQUIRED_HALF_HEADERS)

#: Consumers' tag header (RocketMQ's TAGS); an ordinary user header, passed through.
H_TAGS = "txb.tags"
#: Headers txbridge adds when it moves a record aside.
H_REASON = "txb.reason"
H_ORIGIN = "txb.origin"  # "<topic>/<partition>/<offset>"
H_CHECKS = "txb.checks"
H_RETRY_COUNT = "txb.retry"  # consumers: how many times a message was reconsumed


class TxState(StrEnum):
    """A local transaction's outcome, as the producer or a back-check reports it.

    ``RUNNING`` is a back-check answer only, never an outcome or an op record's state: the
    answering instance is alive and knows that the transaction's local work is still in
    progress. The coordinator asks again later without using up ``max_checks``; an
    UNKNOWN (the instance does not know) uses it up. A coordinator that predates RUNNING
    reads it as UNKNOWN.
    """

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"
    RUNNING = "RUNNING"


class OpSource(StrEnum):
    """Who wrote an end-transaction (op) record."""

    PRODUCER = "producer"
    CHECK = "check"
    ADMIN = "admin"
    EXPIRY = "expiry"


@dataclass(frozen=True)
class Topics:
    """The internal topic names of one namespace."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def half(self) -> str:
        return f"{self.namespace}_half"

    @property
    def op(self) -> str:
        return f"{self.namespace}_op"

    @property
    def state(self) -> str:
        return f"{self.namespace}_state"

    @property
    def producers(self) -> str:
        return f"{self.namespace}_producers"

    @property
    def expired(self) -> str:
        return f"{self.namespace}_expired"

    @property
    def quarantine(self) -> str:
        return f"{self.namespace}_quarantine"

    @property
    def spark_sink(self) -> str:
        """The Spark sink's decision records and journal (``txbridge.spark``; created on first use)."""
        return f"{self.namespace}_spark_sink"

    def retry(self, group: str) -> str:
        """A consumer group's retry topic (RocketMQ's %RETRY%group)."""
        return f"{self.namespace}_retry-{group}"

    def dead_letter(self, group: str) -> str:
        """A consumer group's dead-letter topic (RocketMQ's %DLQ%group)."""
        return f"{self.namespace}_dlq-{group}"


# ---------------------------------------------------------------- ids and partitioning


class _Entropy:
    """``os.urandom``, read :attr:`BLOCK` bytes at a time and handed out in slices.

    ``os.urandom`` releases the GIL around its ``getrandom`` call; on a producer's hot path,
    where librdkafka's delivery threads take the GIL, getting it back cost more than the rest
    of a tx id (docs/results/2026-11-28-producer-path.md). One read per 400 ids keeps the
    ids' random bits from the kernel's CSPRNG, as RFC 9562 asks.
    """

    BLOCK = 4096
    _lock: threading.Lock
    _block: bytes
    _at: int

    def __init__(self) -> None:
        self.forget()

    def take(self, n: int) -> bytes:
        with self._lock:  # two threads never get the same slice
            at = self._at
            if at + n > len(self._block):
                self._block, at = os.urandom(self.BLOCK), 0
            self._at = at + n
            return self._block[at : at + n]

    def forget(self) -> None:
        """Start afresh: a forked child must not hand out its parent's bytes again (the same ids
        in two processes), nor inherit a lock another thread of its parent held."""
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0


_ENTROPY = _Entropy()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ENTROPY.forget)


def new_tx_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered, so tx ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(_ENTROPY.take(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    h = f"{value:032x}"  # uuid.UUID(int=value)'s str, without its checks (a hot path)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


# ---------------------------------------------------------------- young transactions in offset metadata

#: Prefix of the metadata of a coordinator's committed half offset that lists the half
#: records of its young transactions (see coordinator.commit.changelog).
YOUNG_PREFIX = "txb1:"


def encode_young(position: int, offsets: Iterable[int]) -> str:
    """Committed-offset metadata listing half ``offsets`` below ``position`` ("" for none)."""
    back = sorted(position - offset for offset in offsets)
    return YOUNG_PREFIX + ",".join(map(str, back)) if back else ""


def decode_young(position: int, metadata: str | None) -> list[int]:
    """The half offsets listed by the metadata of the committed offset ``position`` (sorted).

    Metadata of any other form lists nothing.

    Raises:
        WireFormatError: the metadata starts with the prefix but does not parse.
    """
    if not metadata or not metadata.startswith(YOUNG_PREFIX):
        return []
    try:
        back = [int(part) for part in metadata[len(YOUNG_PREFIX) :].split(",")]
    except ValueError:
        raise WireFormatError(f"committed offset metadata {metadata[:40]!r} does not parse") from None
    if any(not 0 < b <= position for b in back):
        raise WireFormatError(f"committed offset metadata lists offsets outside 0..{position - 1}")
    return sorted(position - b for b in back)


#: The start of every positions record's key (:func:`journal_key`), and the whole key of the
#: positions record a txbridge from before the journal wrote into ``<ns>_state`` p itself:
#: where its owner's last committed transaction left the half and op partitions, and the young
#: transactions it listed. No tx id can take it: tx ids are text without control characters
#: (:func:`decode_half`).
POSITIONS_KEY = b"\x00txb.positions"


def journal_partition(transactional_id: str, partitions: int) -> int:
    """The ``<ns>_state`` partition where the incarnation committing under ``transactional_id``
    writes the positions of every partition it owns (its journal; named in its claims)."""
    return zlib.crc32(transactional_id.encode()) % partitions


def journal_key(transactional_id: str, partition: int) -> bytes:
    """The key, in its journal, of the positions of ``partition`` as the incarnation committing
    under ``transactional_id`` left them."""
    return b"%s\x00%s\x00%d" % (POSITIONS_KEY, transactional_id.encode(), partition)


def is_positions_key(key: bytes | None) -> bool:
    """Whether ``key`` is a positions record's (:func:`journal_key`, or the older
    :data:`POSITIONS_KEY`)."""
    return key is not None and key.startswith(POSITIONS_KEY)


def parse_journal_key(key: bytes | None) -> tuple[str, int] | None:
    """``(transactional id, partition)`` of a :func:`journal_key`; None for any other key."""
    if key is None or not key.startswith(POSITIONS_KEY + b"\x00"):
        return None
    owner, _, number = key[len(POSITIONS_KEY) + 1 :].rpartition(b"\x00")
    try:
        return owner.decode(), int(number)
    except (UnicodeDecodeError, ValueError):
        return None


def current_positions(
    owners: Sequence[tuple[str, int | None]],
    journals: Mapping[tuple[str, int], Positions],
    partition: int,
    legacy: Positions | None = None,
) -> Positions | None:
    """Where ``partition`` stands: the positions in the journal of the last of its live
    ``owners`` (transactional id, journal partition; oldest first) that wrote any, else
    ``legacy``, the positions record a txbridge from before the journal left in its
    ``<ns>_state`` partition (docs/DESIGN.md, "Ownership").

    An owner writes its positions to its journal before it serves the partition, in the
    transaction that deletes its predecessors' records; one without any never served it.
    """
    for owner, journal in reversed(owners):
        if journal is not None and (owner, partition) in journals:
            return journals[(owner, partition)]
    return legacy


#: The start of every owner record's key in ``<ns>_state`` (:func:`owner_key`), and the whole
#: key of the one owner record per partition that txbridge wrote before claims had keys of
#: their own. A restore older than owner records reads one as an entry that is not valid, logs
#: it and skips it.
OWNER_KEY = b"\x00txb.owner"


def owner_key(transactional_id: str, claim: int) -> bytes:
    """The ``<ns>_state`` key of one claim of a partition (the ``claim``-th of the incarnation
    committing under ``transactional_id``), and of its release.

    One key per claim, not per partition: compaction then keeps every claim until a later owner,
    having fenced or seen released the owner it names, deletes it (docs/DESIGN.md, "Ownership").
    Under one key per partition a later claim or a release could supersede a claim before an
    owner that has to fence it had read it.
    """
    return b"%s\x00%s\x00%d" % (OWNER_KEY, transactional_id.encode(), claim)


def is_owner_key(key: bytes | None) -> bool:
    """Whether ``key`` is an owner record's (:func:`owner_key`, or the older :data:`OWNER_KEY`).
    No tx id starts so: tx ids are text without control characters."""
    return key is not None and key.startswith(OWNER_KEY)


@dataclass(frozen=True)
class OwnerRecord:
    """A claim of a partition, or its release: the value of an :func:`owner_key`.

    Attributes:
        transactional_id: the owner's transactional.id.
        released: False for a claim (written before the owner serves the partition), True for
            a release (in the owner's last transaction for it).
    """

    transactional_id: str
    released: bool = False
    #: The ``<ns>_state`` partition holding this owner's positions (:func:`journal_partition`);
    #: None in a record from before the journal.
    journal: int | None = None

    def encode(self) -> bytes:
        kind = "release" if self.released else "claim"
        body: dict[str, Any] = {"owner": 1, kind: self.transactional_id}
        if self.journal is not None:
            body["journal"] = self.journal
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> OwnerRecord:
        """Raises: WireFormatError: not a version-1 owner record."""
        try:
            body = json.loads(value)
            if body.get("owner") != 1:
                raise WireFormatError(f"owner record has version {body.get('owner')!r}")
            journal = body.get("journal")
            if journal is not None and (
                isinstance(journal, bool) or not isinstance(journal, int) or journal < 0
            ):
                raise WireFormatError(f"owner record names journal {journal!r}")
            if "claim" in body:
                return cls(str(body["claim"]), journal=journal)
            return cls(str(body["release"]), released=True, journal=journal)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise WireFormatError(f"owner record is not valid: {exc}") from None


@dataclass(frozen=True)
class Positions:
    """Where a partition's last committed coordinator transaction left its half and op partitions.

    Attributes:
        half: the next half offset to consume (None: nothing consumed yet).
        op: the next op offset to consume (None: nothing consumed yet).
        young: the young transactions' listing (see :func:`encode_young`; "" for none).
    """

    half: int | None
    op: int | None
    young: str = ""

    def encode(self) -> bytes:
        return json.dumps({"v": 1, "half": self.half, "op": self.op, "young": self.young}).encode()

    @classmethod
    def decode(cls, value: bytes) -> Positions:
        """Raises: WireFormatError: not a version-1 positions record."""
        try:
            body = json.loads(value)
            if body.get("v") != 1:
                raise WireFormatError(f"positions record has version {body.get('v')!r}")
            half, op = body.get("half"), body.get("op")
            return cls(
                None if half is None else int(half), None if op is None else int(op), str(body["young"])
            )
        except (
            UnicodeDecodeError,
            json.JSONDecodeError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
        ) as exc:
            raise WireFormatError(f"positions record is not valid: {exc}") from None


def half_partition(order_key: bytes, partitions: int) -> int:
    """The half/op partition of a transaction: Kafka's default partitioner on its order key."""
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    return (murmur2(order_key) & 0x7FFFFFFF) % partitions


# ---------------------------------------------------------------- half records

Headers = list[tuple[str, bytes]]


class HalfMessage(NamedTuple):
    """One message of a transaction, as carried by a half record.

    Immutable, like the frozen dataclass it was; a named tuple because a coordinator makes one
    per record it reads, and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per
    field) cost three times a tuple's.
    """

    tx_id: str
    seq: int
    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    group: str = ""
    instance: str = ""
    timestamp_ms: int = 0
    check_after_s: float | None = None
    user_headers: tuple[tuple[str, bytes], ...] = ()
    #: the writer's check source (:func:`can_answer`); None on halves written before sources
    source: str | None = None

    def to_headers(self) -> Headers:
        headers: Headers = [
            (H_VERSION, str(VERSION).encode()),
            (H_TX, self.tx_id.encode()),
            (H_SEQ, str(self.seq).encode()),
            (H_TOPIC, self.topic.encode()),
            (H_GROUP, self.group.encode()),
            (H_INSTANCE, self.instance.encode()),
            (H_TS, str(self.timestamp_ms).encode()),
        ]
        if self.partition is not None:
            headers.append((H_PARTITION, str(self.partition).encode()))
        if self.key is not None:
            headers.append((H_KEY, self.key))
        if self.check_after_s is not None:
            headers.append((H_CHECK_AFTER, repr(float(self.check_after_s)).encode()))
        if self.value is None:
            headers.append((H_NULL, b"1"))
        if self.source is not None:
            headers.append((H_SOURCE, self.source.encode()))
        headers.extend(self.user_headers)
        return headers

    def record_key(self) -> bytes:
        """The half record's Kafka key: the tx id (the original key rides in ``txb.key``)."""
        return self.tx_id.encode()

    def republish_headers(self) -> Headers:
        """Headers of the message on its real topic: the user's, plus ``txb.tx``."""
        return [*self.user_headers, (H_TX, self.tx_id.encode())]


def _text(headers: Mapping[str, bytes], name: str) -> str:
    try:
        return headers[name].decode("utf-8")
    except KeyError:
        raise WireFormatError(f"half record has no {name} header") from None
    except UnicodeDecodeError:
        raise WireFormatError(f"half record header {name} is not UTF-8") from None


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise WireFormatError(f"half record header {name}={text!r} is not an integer") from None


#: The control characters a tx id must not hold (C0 and DEL). One regex search per record: a
#: character-by-character test in Python cost the coordinator more than the JSON of the op.
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")


def _check_tx_id(tx_id: str, what: str) -> None:
    """A tx id is text without control characters: keys that start with one are the
    coordinator's own in ``<ns>_state`` (its partitions' positions)."""
    if _CONTROL_CHARACTER.search(tx_id) is not None:
        raise WireFormatError(f"{what} has control characters in its tx id")


def decode_half(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> HalfMessage:
    """Parse a half record.

    Raises:
        WireFormatError: a required header is missing or malformed, or the version is unknown.
    """
    named: dict[str, bytes] = {}
    user: list[tuple[str, bytes]] = []
    for name, raw in headers or ():
        data = raw if raw is not None else b""
        if name in PROTOCOL_HEADERS or name == H_TX:
            named[name] = data
        else:
            user.append((sys.intern(name), data))
    if not _REQUIRED_HALF.issubset(named):
        missing = [h for h in REQUIRED_HALF_HEADERS if h not in named]
        raise WireFormatError(f"half record lacks required headers {missing}")
    version = _text(named, H_VERSION)
    if version != str(VERSION):
        raise WireFormatError(f"half record has wire version {version!r}; this txbridge reads {VERSION}")
    tx_id = _text(named, H_TX)
    if not tx_id:
        raise WireFormatError("half record has an empty txb.tx")
    _check_tx_id(tx_id, "half record")
    seq = _int(_text(named, H_SEQ), H_SEQ)
    # Interned: a coordinator holds these for every pending transaction; they repeat (its state
    # keeps the message as decoded, with no second pass of its own).
    topic = sys.intern(_text(named, H_TOPIC))
    if not topic:
        raise WireFormatError("half record has an empty txb.topic")
    partition = _int(_text(named, H_PARTITION), H_PARTITION) if H_PARTITION in named else None
    check_after = None
    if H_CHECK_AFTER in named:
        try:
            check_after = float(_text(named, H_CHECK_AFTER))
        except ValueError:
            raise WireFormatError("half record header txb.check_after is not a number") from None
    ts = _text(named, H_TS) if H_TS in named else "0"
    return HalfMessage(
        tx_id=tx_id,
        seq=seq,
        topic=topic,
        value=None if H_NULL in named else (value if value is not None else b""),
        key=named.get(H_KEY),
        partition=partition,
        group=sys.intern(_text(named, H_GROUP)),
        instance=sys.intern(_text(named, H_INSTANCE)),
        timestamp_ms=_int(ts, H_TS),
        check_after_s=check_after,
        user_headers=tuple(user),
        source=sys.intern(_text(named, H_SOURCE)) if H_SOURCE in named else None,
    )


# ---------------------------------------------------------------- op records


@dataclass(frozen=True)
class OpRecord:
    """An end-transaction record: the decision on a transaction."""

    tx_id: str
    state: TxState
    source: OpSource
    count: int | None = None  # number of messages; the producer's COMMIT carries it
    group: str = ""
    instance: str = ""
    timestamp_ms: int = 0
    reason: str = ""

    def encode(self) -> tuple[bytes, bytes]:
        """``(key, value)`` of the op record."""
        body: dict[str, Any] = {
            "v": VERSION,
            "tx": self.tx_id,
            "state": self.state.value,
            "source": self.source.value,
            "group": self.group,
            "instance": self.instance,
            "ts": self.timestamp_ms or int(time.time() * 1000),
        }
        if self.count is not None:
            body["count"] = self.count
        if self.reason:
            body["reason"] = self.reason
        return self.tx_id.encode(), json.dumps(body, separators=(",", ":")).encode()


#: Lookups rather than the enums' constructors, which cost more than a dict per op record.
_OP_STATES = {s.value: s for s in (TxState.COMMIT, TxState.ROLLBACK)}
_OP_SOURCES = {s.value: s for s in OpSource}


def decode_op(value: bytes | None) -> OpRecord:
    """Parse an op record's value that holds one decision.

    Raises:
        WireFormatError: not JSON, unknown version or state, a bad field, or a batch
            (:func:`decode_ops` reads both forms).
    """
    body = _op_body(value)
    if "ops" in body:
        raise WireFormatError("op record is a batch of decisions: read it with decode_ops")
    return _op(body.get("tx"), body.get("state"), body.get("count"), body.get("reason", ""), body)


def decode_ops(value: bytes | None) -> list[OpRecord]:
    """Parse an op record's value: one decision, or a batch of them (``"ops"``).

    A batch is several transactions' decisions from one producer instance, written as one
    record (the asyncio producer batches the decisions of one turn of its event loop, per op
    partition): each entry is ``[tx, state, count]`` or ``[tx, state, count, reason]``;
    ``source``, ``group``, ``instance`` and ``ts`` are the batch's.

    Raises:
        WireFormatError: not JSON, unknown version or state, a bad field or entry.
    """
    body = _op_body(value)
    entries = body.get("ops")
    if entries is None:
        return [_op(body.get("tx"), body.get("state"), body.get("count"), body.get("reason", ""), body)]
    if not isinstance(entries, list) or not entries:
        raise WireFormatError("op record's ops is not a non-empty list")
    ops = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) not in (3, 4):
            raise WireFormatError(f"op record's entry {entry!r} is not [tx, state, count(, reason)]")
        ops.append(_op(entry[0], entry[1], entry[2], entry[3] if len(entry) == 4 else "", body))
    return ops


def _op_body(value: bytes | None) -> dict[str, Any]:
    if not value:
        raise WireFormatError("op record has no value")
    try:
        body = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireFormatError(f"op record is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise WireFormatError("op record is not a JSON object")
    if body.get("v") != VERSION:
        raise WireFormatError(f"op record has wire version {body.get('v')!r}; this txbridge reads {VERSION}")
    return body


def _op(tx_id: Any, state: Any, count: Any, reason: Any, body: Mapping[str, Any]) -> OpRecord:
    """One decision of an op record; ``body`` gives what a batch's decisions share."""
    if not isinstance(tx_id, str) or not tx_id:
        raise WireFormatError("op record has no tx id")
    _check_tx_id(tx_id, "op record")
    decision = _OP_STATES.get(state) if isinstance(state, str) else None
    if decision is None:
        raise WireFormatError(f"op record has state {state!r}; only COMMIT or ROLLBACK end a transaction")
    raw_source = body.get("source", OpSource.PRODUCER.value)
    source = _OP_SOURCES.get(raw_source) if isinstance(raw_source, str) else None
    if source is None:
        raise WireFormatError(f"op record has unknown source {raw_source!r}")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise WireFormatError(f"op record has count {count!r}; it must be a positive integer")
    ts = body.get("ts", 0)
    return OpRecord(
        tx_id=tx_id,
        state=decision,
        source=source,
        count=count,
        group=str(body.get("group", "")),
        instance=str(body.get("instance", "")),
        timestamp_ms=ts if isinstance(ts, int) else 0,
        reason=str(reason or ""),
    )


def op_tx_ids(key: bytes | None, value: bytes | None) -> list[str]:
    """The tx ids an op record decides, for readers that need no more: its key, or a batch's
    entries (a batch has no key). Malformed records give none."""
    if key:
        return [key.decode("utf-8", "replace")]
    try:
        return [op.tx_id for op in decode_ops(value)]
    except WireFormatError:
        return []


# ---------------------------------------------------------------- producer registry


@dataclass(frozen=True)
class ProducerInstance:
    """A producer instance's heartbeat in ``<ns>_producers`` (compacted; key ``group/instance``)."""

    group: str
    instance: str
    url: str
    timestamp_ms: int = 0
    #: seconds between this instance's heartbeats (0: not said): a coordinator that sees none
    #: for a few intervals treats the instance as gone before its liveness runs out
    interval_s: float = 0.0
    #: its check function is decisive (the barrier's): safe to ask early once the writer is gone
    decisive: bool = False
    #: the source of truth its check answers from (:func:`can_answer`); None: said by an
    #: instance from before sources, which answers only for its own and for unsourced halves
    source: str | None = None

    def key(self) -> bytes:
        return f"{self.group}/{self.instance}".encode()

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "v": VERSION,
            "group": self.group,
            "instance": self.instance,
            "url": self.url,
            "ts": self.timestamp_ms or int(time.time() * 1000),
        }
        if self.interval_s:
            body["interval"] = self.interval_s
        if self.decisive:
            body["decisive"] = True
        if self.source is not None:
            body["source"] = self.source
        return json.dumps(body, separators=(",", ":")).encode()


def decode_producer(value: bytes) -> ProducerInstance:
    """Parse a registry record value (a null value is a tombstone: the instance left).

    Raises:
        WireFormatError: not the registry's JSON.
    """
    try:
        body = json.loads(value)
        return ProducerInstance(
            group=str(body["group"]),
            instance=str(body["instance"]),
            url=str(body["url"]),
            timestamp_ms=int(body.get("ts", 0)),
            interval_s=float(body.get("interval", 0.0)),
            decisive=body.get("decisive") is True,
            source=str(body["source"]) if body.get("source") is not None else None,
        )
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise WireFormatError(f"producer registry record is not valid: {exc}") from None


#: A check source: only the writing instance itself can answer for its transactions.
SOURCE_INSTANCE = "instance"
#: A check source: every instance of the group answers from one source of truth for all of them.
SOURCE_GROUP = "group"


def can_answer(*, writer: str, tx_source: str | None, instance: str, instance_source: str | None) -> bool:
    """Whether a back-check of a transaction written by instance ``writer`` with check source
    ``tx_source`` may be answered by ``instance``, whose check source is ``instance_source``.

    A check answer is decisive for the source of truth it reads, not for the group: a barrier
    that has never seen a transaction rolls it back in its own database. So another instance
    answers only from the same source (a barrier on the same database, whose identity both
    say), or when it says it answers for the whole group (:data:`SOURCE_GROUP`). A half from
    before sources (``tx_source`` None) is answered by any instance, as it was then.
    """
    if instance == writer or tx_source is None or instance_source == SOURCE_GROUP:
        return True
    return tx_source != SOURCE_INSTANCE and instance_source == tx_source


# ---------------------------------------------------------------- back-check over HTTP

SIGNATURE_HEADER = "Txbridge-Signature"
DEFAULT_SIGNATURE_TOLERANCE_S = 300


@dataclass(frozen=True)
class CheckMessage:
    topic: str
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


#: Most transactions one batched back-check request may carry; a producer refuses more (400).
MAX_CHECK_BATCH = 1000
#: Longest request id (``"id"``) a producer accepts in a back-check body; longer is a 400.
MAX_REQUEST_ID_LENGTH = 64


def new_request_id() -> str:
    """A fresh back-check request id: 128 random bits, hex (what each encoded body carries)."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class CheckRequest:
    """The body of a back-check ``POST`` about one transaction.

    The request id is not a field: each :meth:`encode` draws a fresh one, so every
    ``POST`` is a new request and a producer can refuse a replay of an earlier one.
    """

    tx_id: str
    group: str
    instance: str  # the instance that wrote the half records
    attempt: int
    messages: tuple[CheckMessage, ...] = field(default_factory=tuple)

    def encode(self) -> bytes:
        """The body of one ``POST``, with a fresh request id (two calls give two requests)."""
        return _json({"v": VERSION, "id": new_request_id(), **self._fields()})

    def _fields(self) -> dict[str, Any]:
        def b64(data: bytes | None) -> str | None:
            return None if data is None else base64.b64encode(data).decode()

        return {
            "tx": self.tx_id,
            "group": self.group,
            "instance": self.instance,
            "attempt": self.attempt,
            "messages": [
                {"topic": m.topic, "key": b64(m.key), "headers": [[n, b64(v)] for n, v in m.headers]}
                for m in self.messages
            ],
        }


@dataclass(frozen=True)
class CheckBatch:
    """The body of a batched back-check ``POST``: several transactions of one group.

    Encoded as ``{"v":1,"id":...,"group":...,"checks":[<a CheckRequest without "v" and "id">, ...]}``;
    the answer is ``{"states":{"<tx id>":"COMMIT"|"ROLLBACK"|"UNKNOWN", ...}}``.
    """

    group: str
    checks: tuple[CheckRequest, ...]

    def encode(self) -> bytes:
        """The body of one ``POST``, with a fresh request id (two calls give two requests)."""
        return _json(
            {
                "v": VERSION,
                "id": new_request_id(),
                "group": self.group,
                "checks": [c._fields() for c in self.checks],
            }
        )


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def decode_check_body(body: bytes) -> CheckRequest | CheckBatch:
    """Parse a back-check request body: one transaction, or a batch (it has ``checks``).

    Raises:
        WireFormatError: the body is neither a version-1 check request nor a batch of them
            (or a batch of more than :data:`MAX_CHECK_BATCH`, or of another group's checks).
    """
    return decode_check_post(body)[1]


def decode_check_post(body: bytes) -> tuple[str | None, CheckRequest | CheckBatch]:
    """Parse a back-check request body and its request id.

    Returns:
        ``(id, checks)``: the body's ``"id"``, or ``None`` for a body without one (from a
        coordinator that predates request ids), and what :func:`decode_check_body` returns.

    Raises:
        WireFormatError: as :func:`decode_check_body`, or the id is not a string of 1 to
            :data:`MAX_REQUEST_ID_LENGTH` characters.
    """
    data = _check_json(body)
    request_id = data.get("id")
    if request_id is not None and (
        not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_LENGTH
    ):
        raise WireFormatError(f"check request id must be a string of 1 to {MAX_REQUEST_ID_LENGTH} characters")
    return request_id, _checks_from(data)


def _checks_from(data: dict[str, Any]) -> CheckRequest | CheckBatch:
    if "checks" not in data:
        return _check_from(data)
    try:
        group = str(data["group"])
        items = list(data["checks"])
    except (KeyError, TypeError) as exc:
        raise WireFormatError(f"check batch is not valid: {exc}") from None
    if not items:
        raise WireFormatError("check batch is empty")
    if len(items) > MAX_CHECK_BATCH:
        raise WireFormatError(f"check batch has {len(items)} checks; at most {MAX_CHECK_BATCH} allowed")
    checks = tuple(_check_from(item) for item in items)
    if any(c.group != group for c in checks):
        raise WireFormatError("a check batch holds checks of one group only")
    return CheckBatch(group, checks)


def decode_check_request(body: bytes) -> CheckRequest:
    """Parse a back-check request body about one transaction.

    Raises:
        WireFormatError: the body is not a version-1 check request.
    """
    return _check_from(_check_json(body))


def _check_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
        version = data.get("v")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise WireFormatError(f"check request is not a JSON object: {exc}") from None
    if version != VERSION:
        raise WireFormatError(f"check request has wire version {version!r}")
    return dict(data)


def _check_from(data: Any) -> CheckRequest:
    try:
        messages = tuple(
            CheckMessage(
                topic=str(m["topic"]),
                key=None if m.get("key") is None else base64.b64decode(m["key"]),
                headers=tuple((str(n), base64.b64decode(v or "")) for n, v in m.get("headers", [])),
            )
            for m in data.get("messages", [])
        )
        return CheckRequest(
            tx_id=str(data["tx"]),
            group=str(data["group"]),
            instance=str(data.get("instance", "")),
            attempt=int(data["attempt"]),
            messages=messages,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"check request is not valid: {exc}") from None


#: The states a back-check answer may carry; anything else reads as UNKNOWN.
_CHECK_ANSWERS = frozenset(s.value for s in TxState)


def encode_check_answer(state: TxState) -> bytes:
    return json.dumps({"state": state.value}).encode()


def decode_check_answer(status_code: int, body: bytes) -> TxState:
    """A verdict counts only when it is explicit and well formed; anything else is UNKNOWN.

    (DTM #535: an HTTP 200 with an unexpected body must never read as COMMIT.)
    """
    if status_code != 200:
        return TxState.UNKNOWN
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return TxState.UNKNOWN
    if not isinstance(data, dict) or set(data) - {"state", "count"}:
        return TxState.UNKNOWN
    state = data.get("state")
    if state in _CHECK_ANSWERS:
        return TxState(state)
    return TxState.UNKNOWN


def encode_check_batch_answer(states: Mapping[str, TxState]) -> bytes:
    return _json({"states": {tx: state.value for tx, state in states.items()}})


def decode_check_batch_answer(status_code: int, body: bytes, tx_ids: Iterable[str]) -> dict[str, TxState]:
    """The verdict for each of ``tx_ids``; as for one check, only an explicit one counts.

    A transaction missing from the answer, or with anything but a known state, is UNKNOWN;
    so is every transaction of a non-200 answer or of a body that is not ``{"states": {...}}``.
    """
    states = dict.fromkeys(tx_ids, TxState.UNKNOWN)
    if status_code != 200:
        return states
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return states
    if not isinstance(data, dict) or set(data) != {"states"} or not isinstance(data["states"], dict):
        return states
    for tx, state in data["states"].items():
        if tx in states and state in _CHECK_ANSWERS:
            states[tx] = TxState(state)
    return states


def sign(secret: bytes, body: bytes, *, now: float | None = None) -> str:
    """The ``Txbridge-Signature`` header value for ``body``: ``t=<unix>,v1=<hex>``."""
    ts = int(now if now is not None else time.time())
    digest = hmac.new(secret, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def verify(
    secret: bytes,
    header: str | None,
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: float = DEFAULT_SIGNATURE_TOLERANCE_S,
) -> int:
    """Accept ``body`` only with a fresh, valid signature.

    Returns:
        The signature's timestamp ``t`` (unix seconds): when the request was signed.

    Raises:
        SignatureError: unsigned, malformed, badly signed, or older/newer than ``tolerance_s``.
    """
    if not header:
        raise SignatureError("request is unsigned")
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, sep, val = item.strip().partition("=")
        if sep:
            parts.setdefault(name, []).append(val)
    try:
        ts = int(parts["t"][0])
    except (KeyError, ValueError):
        raise SignatureError("signature has no valid timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - ts) > tolerance_s:
        raise SignatureError(f"signature is stale ({current - ts:.0f}s off, tolerance {tolerance_s:.0f}s)")
    expected = hmac.new(secret, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise SignatureError("signature does not match")
    return ts


def header_dict(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """Headers as a dict (last one wins), ``None`` values as empty bytes."""
    return {name: (value if value is not None else b"") for name, value in headers or ()}
