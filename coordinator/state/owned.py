"""The owned partitions: :class:`OwnedPartitions`, the one owner of their states and positions.

A partition's state (its pending transactions), its positions (where its half and op partitions
are read to) and the work its next commit carries besides the state (:class:`Work`) are installed,
advanced, kept, taken back, set aside for a rewind and dropped here, and nowhere else. The other
parts read them (the loop, the commit cycle, the back-checks) or ask for one of these operations
(the rebalance handling, the commit cycle after an aborted transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.state.partition import PartitionState, PendingTx
from coordinator.state.republisher import Batch
from txbridge.wire import Topics

Position = tuple[str, int]  # (topic, partition)


@dataclass
class Work:
    """What the next commits carry beyond the partitions' own states (added to by the input,
    the back-checks and the commit cycle; forgotten with its partition by :class:`OwnedPartitions`).

    Attributes:
        batch: op records and quarantine copies, per partition.
        ready: partitions where a transaction became READY since their last fill.
        unsaved: partitions that consumed records since their last commit.
        expiring: tx id -> a transaction whose checks are exhausted.
        incomplete: transactions whose half records cannot all be read, with why.
    """

    batch: Batch
    ready: set[int] = field(default_factory=set)
    unsaved: set[int] = field(default_factory=set)
    expiring: dict[str, PendingTx] = field(default_factory=dict)
    incomplete: list[tuple[PendingTx, str]] = field(default_factory=list)

    def busy(self) -> set[int]:
        """Partitions with something to commit besides their states' own work."""
        return (
            self.unsaved
            | self.batch.partitions()
            | {t.partition for t in self.expiring.values()}
            | {t.partition for t, _ in self.incomplete}
        )

    def forget(self, gone: Callable[[int], bool]) -> None:
        """Drop what the partitions ``gone`` picks had waiting (``ready`` stays)."""
        self.batch.clear([n for n in self.batch.partitions() if gone(n)])
        for tx_id in [tx_id for tx_id, tx in self.expiring.items() if gone(tx.partition)]:
            del self.expiring[tx_id]  # in place: the back-checks hold the same dict
        self.incomplete[:] = [(t, r) for t, r in self.incomplete if not gone(t.partition)]
        self.unsaved -= {n for n in self.unsaved if gone(n)}

    def keep_only(self, numbers: Iterable[int]) -> None:
        """Drop everything of the partitions not in ``numbers``."""
        kept = set(numbers)
        self.forget(lambda n: n not in kept)
        self.ready &= kept


class OwnedPartitions:
    """The partitions this coordinator serves, the ones it keeps over an eager rebalance, and the
    ones set aside until they are rewound.

    A partition is *served* (its state installed: records are applied to it and it commits),
    *kept* (revoked with everything committed, its state held in case the group gives it back),
    or *rewinding* (its Kafka transaction aborted: its state is gone until the loop rebuilds it
    from ``<ns>_state``). Its producer is held while it is any of the three (:meth:`held`).

    Args:
        topics: the namespace's topics.
    """

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self._states: dict[int, PartitionState] = {}
        self._positions: dict[Position, int] = {}
        # op partition -> its end at the loop's previous look (Coordinator._ops_caught_up)
        self.op_ends: dict[int, int] = {}
        self.work = Work(Batch(topics))
        self._kept: dict[int, PartitionState] = {}
        # The kept partitions' positions when they were kept: what their states were committed with.
        self._kept_at: dict[Position, int | None] = {}
        self._rewinding: set[int] = set()
        #: The served partitions, replaced (never changed) at each change: read by the resumer's thread.
        self.owned: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ reading

    @property
    def states(self) -> Mapping[int, PartitionState]:
        """Served partition -> its state."""
        return self._states

    @property
    def positions(self) -> Mapping[Position, int]:
        """(topic, partition) -> the next offset to consume, of the served and kept partitions."""
        return self._positions

    def served(self) -> set[int]:
        """The served partitions' numbers (for the resumer's thread: :attr:`owned`)."""
        return set(self.owned)

    def held(self) -> set[int]:
        """Partitions whose producer stays: served, kept or waiting for a rewind."""
        return set(self._states) | set(self._kept) | self._rewinding

    # ------------------------------------------------------------------ the input

    def advance(self, topic: str, number: int, offset: int) -> None:
        """A record before ``offset`` was applied to the partition's state: read on from there."""
        self._positions[(topic, number)] = offset
        self.work.unsaved.add(number)

    # ------------------------------------------------------------------ taking over

    def place(self, topic: str, number: int, offset: int | None) -> None:
        """Where a partition being restored resumes (None: nowhere known, it starts at its beginning)."""
        if offset is None:
            self._positions.pop((topic, number), None)
        else:
            self._positions[(topic, number)] = offset

    def install(self, states: dict[int, PartitionState]) -> None:
        """Serve the restored (or rewound) partitions' states."""
        self._states.update(states)
        self._rewinding -= set(states)
        self.owned = frozenset(self._states)

    # ------------------------------------------------------------------ over a rebalance

    def keep(self, numbers: Iterable[int], busy: set[int], producing: Callable[[int], bool]) -> None:
        """Keep the partitions of ``numbers`` whose work is all committed (not ``busy``, nothing
        unsaved) and whose producer is held (``producing``), for the next assignment."""
        self._kept = {}
        for number in sorted(numbers):
            state = self._states.get(number)
            if state is not None and number not in busy and not state.unsaved and producing(number):
                self._kept[number] = state
        self._kept_at = {
            (topic, number): self._positions.get((topic, number))
            for number in self._kept
            for topic in (self.topics.half, self.topics.op)
        }

    def take_back(self, numbers: Iterable[int], *, check: bool) -> tuple[list[int], list[int]]:
        """Serve again the kept partitions of ``numbers``; returns (taken back, kept ones not given
        back, for the caller to drop). ``check``: assert that nothing moved their positions while
        they were kept."""
        wanted = set(numbers)
        kept, self._kept = self._kept, {}
        back = sorted(set(kept) & wanted)
        for number in back:
            if check:
                self._assert_unmoved(number)
            self._states[number] = kept[number]
        self.owned = frozenset(self._states)
        return back, sorted(set(kept) - wanted)

    def _assert_unmoved(self, number: int) -> None:
        """A kept partition's positions are still those its state was committed with: nothing
        read while it was not served moved them past a record its state never saw."""
        for topic in (self.topics.half, self.topics.op):
            kept_at, now = self._kept_at.get((topic, number)), self._positions.get((topic, number))
            assert now == kept_at, (
                f"kept partition {topic}/{number} moved from position {kept_at} to {now} while it "
                "was not served: the records in between were never applied to its state"
            )

    def forget_kept(self) -> None:
        """Keep nothing (the clients must be replaced)."""
        self._kept = {}

    def lost(self) -> None:
        """The session expired: nothing of the partitions is committed any more (their op
        records and quarantine copies go), and nothing is kept."""
        self.work.batch.clear()
        self._kept = {}

    def drop(self, partitions: Iterable[Any]) -> None:
        """Stop serving ``partitions`` (topic partitions): their states, their work and, but for
        kept ones, their positions go."""
        for tp in partitions:
            if tp.partition not in self._kept:
                self._positions.pop((tp.topic, tp.partition), None)
                if tp.topic == self.topics.op:
                    self.op_ends.pop(tp.partition, None)
            if tp.topic == self.topics.half:
                self._states.pop(tp.partition, None)
                self._rewinding.discard(tp.partition)
        self.owned = frozenset(self._states)
        self.work.keep_only(self._states)

    def reset(self) -> None:
        """Drop everything, kept partitions and positions too (the clients are being replaced)."""
        self.work.batch.clear()
        self.work.unsaved.clear()
        self._kept = {}
        self._states.clear()
        self._rewinding.clear()
        self._positions.clear()
        self.op_ends.clear()
        self.work.keep_only(())
        self.owned = frozenset()

    # ------------------------------------------------------------------ rewinding

    def rewind(self, numbers: list[int]) -> None:
        """Set ``numbers`` aside until they are rebuilt (their Kafka transaction was aborted):
        their states and work go now, so that nothing of them is applied or committed from
        what the aborted transaction left in memory; :meth:`to_rewind` hands them to the loop."""
        for number in numbers:
            self._states.pop(number, None)
        self._rewinding |= set(numbers)
        self.work.forget(lambda n: n in numbers)
        self.work.ready -= set(numbers)
        self.owned = frozenset(self._states)

    def to_rewind(self) -> list[int]:
        """The partitions set aside for a rewind and still held (:meth:`rewind`)."""
        return sorted(self._rewinding)
