"""One pending transaction of a partition (:class:`PendingTx`) and where its halves lie (:class:`HalfRef`).

Apart from :mod:`coordinator.state.partition` so that the parts of a partition's state
(:mod:`coordinator.state.check_queue`, :mod:`coordinator.state.key_order`) can name it without
importing the state that owns them. See :mod:`coordinator.state.partition` for the phases,
the readiness rules and the memory a transaction costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from coordinator.state.phase import TRANSITIONS, Phase
from txbridge.errors import TransactionStateError
from txbridge.wire import HalfMessage, OpSource, TxState


class Changes(Protocol):
    """Told when a transaction's dirty flag changes (:class:`coordinator.state.unsaved.UnsavedChanges`)."""

    def changed(self, tx: PendingTx) -> None: ...


class Owner(Protocol):
    """The state whose pending set holds a transaction: told when its tracked fields change."""

    payload_bytes: int

    @property
    def unsaved(self) -> Changes: ...

    def _moved(self, tx: PendingTx, before: Phase) -> None: ...

    def _rescheduled(self, tx: PendingTx) -> None: ...


@dataclass(slots=True)
class HalfRef:
    """Where a half record lies; ``message`` is None when its payload was evicted from the cache.

    Change ``message`` through :meth:`PendingTx.set_payload` / :meth:`PendingTx.drop_payloads`
    so that the owning state's byte count stays right.
    """

    offset: int
    size: int
    topic: str = ""  # kept when the payload is evicted: back-check requests name it
    key: bytes | None = None
    message: HalfMessage | None = None


_NO_HALVES: Mapping[int, HalfRef] = MappingProxyType({})


class PendingTx:
    """One transaction not yet resolved on its partition.

    A slotted class rather than a dataclass: ``phase``, ``dirty`` and
    ``next_check_ms`` are properties that keep the owning
    :class:`~coordinator.state.partition.PartitionState`'s
    indexes current, and the halves of a one-half transaction (the common case) are
    kept without a dict. ``halves`` is a read-only view; halves are added by the state.
    """

    __slots__ = (
        "_dirty",
        "_halves",
        "_next_check_ms",
        "_owner",
        "_phase",
        "check_after_s",
        "check_source",
        "checks",
        "count",
        "decided_ms",
        "decided_seq",
        "decision_source",
        "first_append_ms",
        "group",
        "instance",
        "partition",
        "persisted",
        "problem",
        "tx_id",
        "unasked_since_ms",
        "wait_offset",
    )

    def __init__(
        self,
        tx_id: str,
        partition: int,
        phase: Phase = Phase.OPEN,
        *,
        halves: Mapping[int, HalfRef] | None = None,
        group: str = "",
        instance: str = "",
        first_append_ms: int | None = None,
        check_after_s: float | None = None,
        decision_source: OpSource | None = None,
        count: int | None = None,
        wait_offset: int | None = None,
        checks: int = 0,
        next_check_ms: int | None = None,
        decided_seq: int = 0,
        dirty: bool = True,
        persisted: bool = False,
        unasked_since_ms: int | None = None,
        problem: str = "",
        check_source: str | None = None,
    ) -> None:
        self.tx_id = tx_id
        self.partition = partition
        self._phase = phase
        # None: no half; a HalfRef: exactly seq 0; a dict: anything else.
        self._halves: HalfRef | dict[int, HalfRef] | None = None
        if halves:
            for seq, ref in sorted(halves.items()):
                self._add_half(seq, ref)
        self.group = group
        self.instance = instance
        # The writer's check source, from its halves (txbridge.wire.can_answer): who may answer for it.
        self.check_source = check_source
        self.first_append_ms = first_append_ms
        self.check_after_s = check_after_s
        self.decision_source = decision_source
        self.count = count
        self.wait_offset = wait_offset  # set by PartitionState.set_end_offset only
        self.checks = checks
        self._next_check_ms = next_check_ms
        self.decided_seq = decided_seq  # position in the partition's decision order
        # The append time of its COMMIT op record, when this process read it (not restored):
        # where the commit-to-visible histogram starts.
        self.decided_ms: int | None = None
        self._dirty = dirty  # changed since its last <ns>_state entry
        self.persisted = persisted  # has a live <ns>_state entry (tombstone it when resolved)
        # Since when no back-check could be sent (no live instance, no secret, URL refused),
        # and why; None / "" once one was asked. Not-asked checks do not count in ``checks``.
        self.unasked_since_ms = unasked_since_ms
        self.problem = problem
        self._owner: Owner | None = None  # the state whose pending set holds it

    def __repr__(self) -> str:
        return (
            f"PendingTx({self.tx_id!r}, partition={self.partition}, phase={self._phase.value}, "
            f"halves={sorted(self.halves)}, checks={self.checks})"
        )

    # ------------------------------------------------------------------ tracked fields

    @property
    def phase(self) -> Phase:
        """The current phase; changed only by :meth:`move`."""
        return self._phase

    def move(self, to: Phase) -> None:
        """The one guarded setter of ``phase``.

        Raises:
            TransactionStateError: ``to`` is not allowed from the current phase.
        """
        before = self._phase
        if to not in TRANSITIONS[before]:
            raise TransactionStateError(f"tx {self.tx_id}: {before} -> {to} is not allowed")
        self._phase = to
        self.dirty = True
        if self._owner is not None:
            self._owner._moved(self, before)

    @property
    def dirty(self) -> bool:
        """Changed since its last ``<ns>_state`` entry."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if self._owner is not None:
            self._owner.unsaved.changed(self)

    @property
    def next_check_ms(self) -> int | None:
        """When to back-check it next (coordinator clock); None until first scheduled."""
        return self._next_check_ms

    @next_check_ms.setter
    def next_check_ms(self, value: int | None) -> None:
        self._next_check_ms = value
        if self._owner is not None:
            self._owner._rescheduled(self)

    # ------------------------------------------------------------------ halves

    @property
    def halves(self) -> Mapping[int, HalfRef]:
        """seq -> half (read-only)."""
        h = self._halves
        if h is None:
            return _NO_HALVES
        return MappingProxyType({0: h} if isinstance(h, HalfRef) else h)

    def _add_half(self, seq: int, ref: HalfRef) -> bool:
        """Add a half; False when that seq is already known."""
        h = self._halves
        if h is None:
            self._halves = ref if seq == 0 else {seq: ref}
        elif isinstance(h, HalfRef):
            if seq == 0:
                return False
            self._halves = {0: h, seq: ref}
        elif seq in h:
            return False
        else:
            h[seq] = ref
        return True

    def has_half(self, seq: int) -> bool:
        h = self._halves
        if h is None or isinstance(h, HalfRef):
            return h is not None and seq == 0
        return seq in h

    def half_count(self) -> int:
        h = self._halves
        return 0 if h is None else 1 if isinstance(h, HalfRef) else len(h)

    def ordered_halves(self) -> list[HalfRef]:
        h = self._halves
        if h is None:
            return []
        if isinstance(h, HalfRef):
            return [h]
        return [h[seq] for seq in sorted(h)]

    def complete(self) -> bool:
        """True when every half of a decided COMMIT is known (see the module docstring)."""
        h = self._halves
        if self.count is None and h is None:
            return False
        wanted = self.count if self.count is not None else self.half_count()
        if h is None or isinstance(h, HalfRef):
            return wanted <= (0 if h is None else 1)
        return all(seq in h for seq in range(wanted))

    def message_keys(self) -> frozenset[bytes]:
        """The distinct message keys of the halves seen so far. Per-key order holds it against
        every earlier transaction sharing any of them, not only its first message's key."""
        h = self._halves
        if h is None:
            return frozenset()
        if isinstance(h, HalfRef):
            return frozenset(()) if h.key is None else frozenset((h.key,))
        return frozenset(ref.key for ref in h.values() if ref.key is not None)

    def first_offset(self) -> int:
        """Offset of its earliest half record seen (its place in the producers' order)."""
        h = self._halves
        if h is None:
            return -1
        if isinstance(h, HalfRef):
            return h.offset
        return min(ref.offset for ref in h.values())

    # ------------------------------------------------------------------ payloads

    def cached_bytes(self) -> int:
        h = self._halves
        if h is None:
            return 0
        if isinstance(h, HalfRef):
            return h.size if h.message is not None else 0
        return sum(ref.size for ref in h.values() if ref.message is not None)

    def set_payload(self, ref: HalfRef, message: HalfMessage) -> None:
        """Put a re-read payload back into ``ref`` (one of this transaction's halves)."""
        if ref.message is None and self._owner is not None:
            self._owner.payload_bytes += ref.size
        ref.message = message

    def drop_payloads(self) -> int:
        """Evict every cached payload of this transaction. Returns the bytes dropped."""
        dropped = 0
        for ref in self.ordered_halves():
            if ref.message is not None:
                ref.message = None
                dropped += ref.size
        if self._owner is not None:
            self._owner.payload_bytes -= dropped
        return dropped

    @property
    def decision(self) -> TxState | None:
        if self._phase in (Phase.COMMITTED, Phase.READY, Phase.PUBLISHED, Phase.QUARANTINED):
            return TxState.COMMIT
        if self._phase in (Phase.ROLLED_BACK, Phase.EXPIRED):
            return TxState.ROLLBACK
        return None
