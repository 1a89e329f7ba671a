"""One admin decision per transaction, even when two operators act at once.

``txbridge admin resolve`` and ``txbridge admin requeue`` publish a transaction's
messages (directly, or through the coordinator). Checking "was it done already?"
and then publishing is a race: two operators can both pass the check before
either commits. :func:`decide_once` closes it with Kafka's producer fencing:

1. A transactional producer whose ``transactional.id`` derives from the tx id
   (:func:`fence_id`) calls ``init_transactions()``. The broker then completes an
   earlier admin's Kafka transaction for that tx id if its commit had begun, aborts
   it otherwise, and bumps the epoch: that earlier admin can no longer commit.
2. Only then the *marker topic* (``<ns>_expired`` or ``<ns>_quarantine``) is read,
   read_committed, up to the end offset it has now (open transactions included:
   the read waits until they end), for an earlier decision's :class:`Marker`.
3. No marker: the caller's records and a new marker go out in one Kafka transaction.

Two concurrent calls: the later ``init_transactions()`` fences the earlier call,
whose commit fails (nothing of it is visible), or waits for the earlier commit to
complete and then reads its marker ("already done"). Either way one call commits.

The marker lives in the topic that holds the copies it refers to, so it is kept as
long as they are (``<ns>_op`` keeps records 7 days, the side topics 30).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from txbridge import kafka
from txbridge.admin.side_topics import produce, read_committed
from txbridge.errors import KafkaOperationError, ProducerFencedError, TxBridgeError
from txbridge.kafka import Producer
from txbridge.wire import H_ORIGIN, VERSION, TxState, header_dict

logger = logging.getLogger(__name__)

#: Header that marks an admin marker record in ``<ns>_expired`` / ``<ns>_quarantine``;
#: its value is the action. The coordinator's copies always carry ``txb.origin``, markers never.
H_ADMIN = "txb.admin"
RESOLVE = "resolve"
REQUEUE = "requeue"

_KAFKA_TIMEOUT_S = 30
#: An admin transaction left open by a crashed admin is aborted by the broker after this,
#: so a later reader never waits longer for it (librdkafka's default is 60 s).
_TRANSACTION_TIMEOUT_MS = 30_000
_MAX_ID_CHARS = 200


def fence_id(namespace: str, tx_id: str) -> str:
    """The ``transactional.id`` every admin decision about ``tx_id`` uses (hashed when long)."""
    plain = f"{namespace}-admin-{tx_id}"
    if len(plain) <= _MAX_ID_CHARS:
        return plain
    digest = hashlib.sha256(plain.encode()).hexdigest()[:40]
    return f"{namespace[:100]}-admin-sha256-{digest}"


@dataclass(frozen=True)
class Marker:
    """An admin's decision about one transaction, kept beside its copies.

    Attributes:
        tx_id: the transaction decided on (the record's key).
        action: ``resolve`` (an expired transaction) or ``requeue`` (a quarantined one).
        state: COMMIT or ROLLBACK (a requeue is a COMMIT).
        attempt: unique per admin call, so a call recognises its own marker.
        new_tx_id: a requeue's new transaction (its messages, re-driven through the coordinator).
        timestamp_ms: when it was decided.
    """

    tx_id: str
    action: str
    state: TxState
    attempt: str
    new_tx_id: str = ""
    timestamp_ms: int = 0

    def record(self) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        """``(key, value, headers)`` of the marker record."""
        body: dict[str, Any] = {
            "v": VERSION,
            "tx": self.tx_id,
            "action": self.action,
            "state": self.state.value,
            "attempt": self.attempt,
            "ts": self.timestamp_ms or int(time.time() * 1000),
        }
        if self.new_tx_id:
            body["new_tx"] = self.new_tx_id
        value = json.dumps(body, separators=(",", ":")).encode()
        return self.tx_id.encode(), value, [(H_ADMIN, self.action.encode())]

    @property
    def verb(self) -> str:
        return "requeued" if self.action == REQUEUE else "resolved"

    def describe(self) -> str:
        """``requeued as <tx>`` / ``resolved COMMIT``: what the marker says was done."""
        if self.action == REQUEUE:
            return f"requeued as {self.new_tx_id}"
        return f"resolved {self.state.value}"


def decode_marker(headers: Sequence[tuple[str, bytes | None]] | None, value: bytes | None) -> Marker | None:
    """The marker a record holds; None for anything else (a copy, a raw record, a bad marker)."""
    named = header_dict(headers)
    if H_ADMIN not in named or H_ORIGIN in named or not value:
        return None
    try:
        body = json.loads(value)
        marker = Marker(
            tx_id=str(body["tx"]),
            action=str(body["action"]),
            state=TxState(body["state"]),
            attempt=str(body["attempt"]),
            new_tx_id=str(body.get("new_tx", "")),
            timestamp_ms=int(body.get("ts", 0)),
        )
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        logger.warning("an admin marker that does not parse is ignored: %r", value[:200])
        return None
    decided = marker.state is TxState.COMMIT or marker.state is TxState.ROLLBACK
    return marker if body.get("v") == VERSION and marker.tx_id and decided else None


def markers_of(records: list[Any], tx_id: str | None = None) -> list[Marker]:
    """The markers among ``records`` (about ``tx_id`` only, when given), oldest first."""
    found = []
    for msg in records:
        marker = decode_marker(msg.headers(), msg.value())
        if marker is not None and (tx_id is None or marker.tx_id == tx_id):
            found.append(marker)
    return found


class AlreadyDecidedError(TxBridgeError):
    """An admin decided on this transaction before; nothing was published by this call.

    Attributes:
        marker: the earlier decision.
    """

    def __init__(self, message: str, marker: Marker) -> None:
        super().__init__(message)
        self.marker = marker


#: Produces a decision's records (not the marker) into the open Kafka transaction.
Writer = Callable[[Any], None]


def decide_once(
    bootstrap: str,
    namespace: str,
    marker_topic: str,
    draft: Marker,
    write: Writer,
    *,
    earlier: Callable[[], Marker | None] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Marker:
    """Commit ``draft``'s decision and what ``write`` produces, unless an admin decided before.

    Args:
        bootstrap: Kafka bootstrap servers.
        namespace: the txbridge namespace (part of the fencing ``transactional.id``).
        marker_topic: where the marker goes and earlier markers are looked for.
        draft: the decision; its ``attempt`` is replaced by a fresh one.
        write: produces the decision's records into the open Kafka transaction.
        earlier: another place to look for an earlier decision, called after fencing.
        extra: librdkafka settings for every client.

    Returns:
        The committed marker.

    Raises:
        AlreadyDecidedError: an admin decided on it before (or at the same time, and won).
        KafkaOperationError: nothing could be committed; the message says whether anything
            was published (a rerun is always safe: it fences this attempt first).
    """
    tx_id = draft.tx_id
    mine = replace(draft, attempt=uuid.uuid4().hex, timestamp_ms=int(time.time() * 1000))
    producer = kafka.producer(
        bootstrap,
        extra,
        transactional_id=fence_id(namespace, tx_id),
        transaction_timeout_ms=_TRANSACTION_TIMEOUT_MS,
    )
    try:
        producer.init_transactions(_KAFKA_TIMEOUT_S)
    except Exception as exc:
        raise kafka.to_error(exc, f"fencing other admins of tx {tx_id} (nothing was published)") from exc

    def reread() -> list[Marker]:
        return markers_of(read_committed(bootstrap, marker_topic, wait_for_open=True, extra=extra), tx_id)

    done = reread()
    before = done[0] if done else (earlier() if earlier is not None else None)
    if before is not None:
        raise AlreadyDecidedError(f"transaction {tx_id} was already {before.describe()} by an admin", before)
    try:
        producer.begin_transaction()
        write(producer)
        key, value, headers = mine.record()
        produce(producer, marker_topic, key, value, headers=headers)
    except Exception as exc:
        error = kafka.to_error(exc, f"writing the decision on tx {tx_id}")
        if not error.fatal:
            _abort_quietly(producer, tx_id)
        raise _not_published(mine, error, reread) from exc
    try:
        producer.commit_transaction(_KAFKA_TIMEOUT_S)
    except Exception as exc:
        return _settle(producer, mine, kafka.to_error(exc, f"committing tx {tx_id}"), reread)
    logger.info("tx %s: %s by admin", tx_id, mine.describe())
    return mine


def _abort_quietly(producer: Producer, tx_id: str) -> bool:
    try:
        producer.abort_transaction(_KAFKA_TIMEOUT_S)
    except Exception as exc:  # it is aborted by the broker after the transaction timeout anyway
        logger.warning("aborting the admin transaction of tx %s: %s", tx_id, exc)
        return False
    return True


def _not_published(
    mine: Marker, error: KafkaOperationError, reread: Callable[[], list[Marker]]
) -> TxBridgeError:
    """This attempt failed before its commit, so it published nothing: say whether another
    admin's attempt fenced it (its write then fails too, often as a bare _FATAL)."""
    if not (isinstance(error, ProducerFencedError) or error.fatal):
        return KafkaOperationError(f"{error} (nothing was published)")
    try:
        seen = reread()
    except TxBridgeError:
        seen = []
    return _lost_race(mine.tx_id, error, seen)


def _lost_race(tx_id: str, error: KafkaOperationError, seen: list[Marker]) -> TxBridgeError:
    """The error of an attempt that another admin's fenced: the winner's decision when it is
    readable, else what the fence looked like. Nothing was published by this attempt."""
    if seen:
        return AlreadyDecidedError(
            f"another admin {seen[0].verb} transaction {tx_id} at the same time ({seen[0].describe()}); "
            "nothing was published by this call",
            seen[0],
        )
    if isinstance(error, ProducerFencedError):
        return KafkaOperationError(
            f"another admin took over transaction {tx_id} at the same time (this call was fenced); "
            "nothing was published by this call"
        )
    # Under KIP-890 a fence can also surface as INVALID_TXN_STATE (KAFKA-20785), and a call
    # after it as _FATAL.
    return KafkaOperationError(
        f"{error}, likely fenced by another admin acting on transaction {tx_id} at the same time; "
        "nothing was published by this call"
    )


def _settle(
    producer: Producer, mine: Marker, error: KafkaOperationError, reread: Callable[[], list[Marker]]
) -> Marker:
    """After a failed commit: find out whether this attempt, another one, or none committed."""
    tx_id = mine.tx_id
    aborted = error.txn_requires_abort and not error.fatal and _abort_quietly(producer, tx_id)
    try:
        seen = reread()
    except TxBridgeError as exc:
        raise KafkaOperationError(
            f"{error}; whether it was published is unknown ({exc}): run the command again "
            "(a rerun fences this attempt first, so nothing is published twice)"
        ) from exc
    if any(m.attempt == mine.attempt for m in seen):
        logger.info("tx %s: the commit reported %s but it landed", tx_id, error)
        return next(m for m in seen if m.attempt == mine.attempt)
    if seen or isinstance(error, ProducerFencedError) or error.fatal:
        # A dead producer sends nothing more, and the read above waited for what it had sent.
        raise _lost_race(tx_id, error, seen)
    if aborted:
        raise KafkaOperationError(f"{error}; nothing was published by this call: run it again")
    raise KafkaOperationError(
        f"{error}; whether it was published is unknown: run the command again "
        "(a rerun fences this attempt first, so nothing is published twice)"
    )
