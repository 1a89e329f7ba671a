"""Where partitions stand when a coordinator takes them over: the changelog in ``<ns>_state``,
each partition's positions, and the young halves re-read, rebuilt into their states.

:class:`Restorer` is one of the coordinator's collaborators (docs/DESIGN.md, "The coordinator's
parts"). The rebalancer claims the partitions first (``Ownership.claim``, which fences
the earlier owner the last owner record names) and then asks it where they stand: that order
is the ownership argument (docs/DESIGN.md, "Ownership"). It also serves a rewind, which reads
the same after a failed Kafka transaction. The positions it reads are placed with the owned partitions
(:meth:`coordinator.state.owned.OwnedPartitions.place`), before their states are installed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from coordinator.commit import changelog
from coordinator.commit.payloads import HalfReader
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.metrics import Stats
from coordinator.monitoring.watchdog import Watchdog
from coordinator.state.partition import PartitionState
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.kafka import Consumer, TopicPartition
from txbridge.wire import Topics, decode_young

logger = logging.getLogger(__name__)

#: How long a takeover waits for ``<ns>_state`` and the committed offsets to settle: an earlier
#: owner's transaction left open under an id nobody claims is waited out, up to its timeout.
RESTORE_WAIT_S = 900.0
_SETTLE_S = 5.0  # how long a transaction opened after the restore may stay open (assert_settled)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Placement(Protocol):
    """Where the restore puts the positions it reads (:class:`coordinator.state.owned.OwnedPartitions`)."""

    @property
    def positions(self) -> Mapping[tuple[str, int], int]: ...

    def place(self, topic: str, number: int, offset: int | None) -> None: ...


class Restorer:
    """Reads where partitions stand and rebuilds their state.

    Args:
        config: the coordinator's settings.
        topics: the namespace's topics.
        stats: the counters.
        watchdog: bounds the blocking reads.
        positions: (topic, partition) -> the next offset to consume; :meth:`take_positions`
            places those of the partitions it reads.
        reader: re-reads half records by offset (the young halves).
        now_ms: the brokers' clock (:class:`coordinator.checks.broker_clock.BrokerClock`), the append
            time of a half of a topic that keeps CreateTime.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        topics: Topics,
        stats: Stats,
        watchdog: Watchdog,
        *,
        positions: Placement,
        reader: HalfReader,
        now_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.config = config
        self.topics = topics
        self.stats = stats
        self._positions = positions
        self._reader = reader
        self._watchdog = watchdog
        self._now_ms = now_ms

    def read_changelog(self, numbers: list[int]) -> changelog.Restored:
        """``numbers``' pending transactions and positions in ``<ns>_state``, read to its end."""
        return changelog.restore(
            self.config.bootstrap,
            self.topics.state,
            numbers,
            self.config.extra_config,
            timeout=RESTORE_WAIT_S,
        )

    def take_positions(
        self, numbers: list[int], restored: changelog.Restored, consumer: Consumer
    ) -> dict[int, list[int]]:
        """Where ``numbers`` resume: their positions records, read in the same transactions as
        their changelog entries; for a partition an older txbridge served (no record yet), the
        group's committed offsets. Returns the young halves' offsets per partition."""
        for number in numbers:
            for topic in (self.topics.half, self.topics.op):
                self._positions.place(topic, number, None)
        committed = []
        for number, where in restored.positions.items():
            if where.half is not None:
                committed.append(TopicPartition(self.topics.half, number, where.half, where.young))
            if where.op is not None:
                committed.append(TopicPartition(self.topics.op, number, where.op))
        older = [
            kafka.partition_at(t, n)
            for n in numbers
            if n not in restored.positions
            for t in (self.topics.half, self.topics.op)
        ]
        if older:
            committed += self._stable_committed(consumer, older)
        return self._take_committed(committed)

    def assert_settled(self, numbers: list[int], committed: Consumer) -> None:
        """The ownership invariant (tests turn it on): once partitions are claimed and restored,
        no transaction that was open on their ``<ns>_state`` stays open, so the restore saw
        every entry and tombstone an earlier owner committed. ``committed`` is a read_committed
        consumer: its "high" watermark is the last stable offset. An earlier owner's transaction
        left open under a name the claim does not fence breaks it (shared/findings/ownership.md).

        A transaction opened after the restore is allowed a moment: with two coordinators under
        one instance id (a misconfiguration the tests make) the other one may claim the partition
        again and commit on it; that one ends within milliseconds, a stale one does not.
        """
        uncommitted = kafka.consumer(
            self.config.bootstrap,
            self.config.group_id,
            self.config.extra_config,
            isolation_level="read_uncommitted",
        )
        try:
            for number in numbers:
                tp = kafka.partition_at(self.topics.state, number)
                high = uncommitted.get_watermark_offsets(tp, timeout=10)[1]
                deadline = time.monotonic() + _SETTLE_S
                while (stable := committed.get_watermark_offsets(tp, timeout=10)[1]) < high:
                    assert time.monotonic() < deadline, (
                        f"{self.topics.state}/{number}: a transaction is still open {_SETTLE_S:.0f}s after "
                        f"the claim (last stable offset {stable}, high watermark {high})"
                    )
                    time.sleep(0.05)
        finally:
            uncommitted.close()

    def _stable_committed(self, consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The committed offsets of ``partitions``, once no open transaction holds them.

        After the claim only a transaction under an id no coordinator uses can hold them: it is
        waited out, up to :data:`RESTORE_WAIT_S`.
        """
        give_up = time.monotonic() + RESTORE_WAIT_S
        while True:
            try:
                with self._watchdog.deadline("reading the committed offsets", 10):
                    return list(consumer.committed(partitions, timeout=10))
            except Exception as exc:
                error = kafka.to_error(exc, "reading the committed offsets")
                if time.monotonic() > give_up:
                    raise error from exc
                logger.warning(
                    "the committed offsets of partitions %s are not stable yet (%s): a transaction under an "
                    "id that is not a partition's holds them; waiting until it ends",
                    sorted({tp.partition for tp in partitions}),
                    error,
                )

    def _take_committed(self, committed: list[Any]) -> dict[int, list[int]]:
        """Positions from the committed offsets; returns the young halves' offsets per partition."""
        young: dict[int, list[int]] = {}
        for tp in committed:
            if tp.offset < 0:
                continue
            self._positions.place(tp.topic, tp.partition, tp.offset)
            if tp.topic == self.topics.half:
                try:
                    young[tp.partition] = decode_young(tp.offset, tp.metadata)
                except WireFormatError:
                    logger.exception("%s/%d: its young transactions are lost", tp.topic, tp.partition)
        return young

    def restore(
        self, numbers: list[int], read: changelog.Restored, listed: dict[int, list[int]], consumer: Consumer
    ) -> dict[int, PartitionState]:
        """Rebuild the partitions' state from ``<ns>_state`` and the young halves (re-read);
        ``consumer`` answers for a partition with no position yet (where its half partition starts)."""
        states: dict[int, PartitionState] = {}
        restored = read.pending
        for number in numbers:
            start = self._positions.positions.get((self.topics.half, number))
            if start is None:
                with self._watchdog.deadline("reading a half partition's offsets", 10):
                    low, _high = consumer.get_watermark_offsets(
                        kafka.partition_at(self.topics.half, number), timeout=10
                    )
                start = max(low, 0)
            state = PartitionState(
                number, self.stats, half_position=start, debug=self.config.check_invariants or None
            )
            for tx in restored.get(number, []):
                state.add_restored(tx)
            young = self._restore_young(state, listed.get(number, []))
            states[number] = state
            if number in restored or young:
                logger.info(
                    "partition %d: restored %d pending transactions and %d young ones",
                    number,
                    len(restored.get(number, [])),
                    young,
                )

        return states

    def _restore_young(self, state: PartitionState, offsets: list[int]) -> int:
        """Re-read the halves the committed offset lists; returns how many transactions they make."""
        if not offsets:
            return 0
        records = self._reader.read(state.partition, offsets)
        if len(records) < len(offsets):
            logger.error(
                "%s/%d: %d listed half records are gone (retention?)",
                self.topics.half,
                state.partition,
                len(offsets) - len(records),
            )
        txs: set[str] = set()
        for offset, record in sorted(records.items()):
            tx = state.on_half(record.message, offset, record.size, record.append_ms or self._now_ms())
            if tx is not None:
                txs.add(tx.tx_id)
        return len(txs)
