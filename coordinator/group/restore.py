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
from typing import Any, Protocol, TypeVar

from coordinator.commit import changelog
from coordinator.commit.payloads import HalfReader
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.metrics import Stats
from coordinator.monitoring.watchdog import Watchdog
from coordinator.state.partition import PartitionState
from txbridge import kafka
from txbridge import positions as group_positions
from txbridge.errors import ConfigurationError, KafkaOperationError, WireFormatError
from txbridge.kafka import AdminClient, Consumer, KafkaError, TopicPartition
from txbridge.wire import Positions, Topics, decode_young

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long a takeover waits for ``<ns>_state`` and the committed offsets to settle: an earlier
#: owner's transaction left open under an id nobody claims is waited out, up to its timeout.
RESTORE_WAIT_S = 900.0
_SETTLE_S = 5.0
#: How soon a committed-offsets read answered with an error is asked again.
_ASK_AGAIN_S = 0.1
#: A committed-offsets read refused for want of an ACL: no wait ends it.
_REFUSED = (
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
)  # how long a transaction opened after the restore may stay open (assert_settled)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _committed(consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
    """``consumer.committed(partitions)``, raising the first partition's error if one has any."""
    committed = list(consumer.committed(partitions, timeout=10))
    failed = next((tp.error for tp in committed if tp.error is not None), None)
    if failed is not None:
        raise kafka.KafkaException(failed)
    return committed


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
        read_positions: reads the positions group's committed positions of some partitions
            (default :func:`txbridge.positions.read` on an admin client of its own).
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
        read_positions: Callable[[list[int]], Mapping[int, Positions]] | None = None,
    ) -> None:
        self.config = config
        self.topics = topics
        self.stats = stats
        self._positions = positions
        self._reader = reader
        self._watchdog = watchdog
        self._now_ms = now_ms
        self._read_positions = read_positions or self._read_group
        self._admin: AdminClient | None = None

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
        """Where ``numbers`` resume: the positions group's committed offsets, committed in the
        same transactions as their changelog entries (:mod:`txbridge.positions`); for a
        partition this txbridge has not committed yet, the positions record an earlier one wrote
        in ``<ns>_state``, or before those the coordinators' group's committed offsets
        (``consumer``'s). Returns the young halves' offsets per partition.

        The group is read after the claim, like ``<ns>_state``: the fence aborted whatever an
        earlier owner left open, and a transaction under an id nobody claims is waited out
        (the read asks for stable offsets).

        Raises:
            ConfigurationError: the principal may not read a group's offsets (an ACL to grant).
        """
        for number in numbers:
            for topic in (self.topics.half, self.topics.op):
                self._positions.place(topic, number, None)
        group = group_positions.group(self.config.namespace)
        found = self._stable(lambda: dict(self._read_positions(numbers)), numbers, group)
        earlier = {n: where for n, where in restored.positions.items() if n not in found}
        topics = self.topics
        where = {**earlier, **found}
        committed = [tp for n, w in where.items() for tp in group_positions.offsets(topics, n, w)]
        older = group_positions.wanted(topics, (n for n in numbers if n not in found and n not in earlier))
        if older:
            older_numbers = sorted({tp.partition for tp in older})
            committed += self._stable(
                lambda: _committed(consumer, older), older_numbers, self.config.group_id
            )
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

    def _read_group(self, numbers: list[int]) -> Mapping[int, Positions]:
        if self._admin is None:
            self._admin = kafka.admin(self.config.bootstrap, self.config.extra_config)
        return group_positions.read(self._admin, self.topics, numbers, timeout=10)

    def _stable(self, read: Callable[[], _T], numbers: list[int], group: str) -> _T:
        """``read()`` of ``group``'s committed offsets of ``numbers``, once no open transaction
        holds them.

        After the claim only a transaction under an id no coordinator uses can hold them: it is
        waited out, up to :data:`RESTORE_WAIT_S`. A partition answered with an error is never
        taken for one with no offset (that would resume it from its start): it is asked again.

        Raises:
            ConfigurationError: the principal may not read the group's offsets (an ACL to grant).
        """
        give_up = time.monotonic() + RESTORE_WAIT_S
        while True:
            try:
                with self._watchdog.deadline(f"reading the committed offsets of group {group!r}", 10):
                    return read()
            except Exception as exc:
                error = (
                    exc
                    if isinstance(exc, KafkaOperationError)
                    else kafka.to_error(exc, f"reading the committed offsets of group {group!r}")
                )
                if error.code in _REFUSED:
                    raise ConfigurationError(
                        f"{error}: the coordinator's principal may not read the offsets of group "
                        f"{group!r}; grant it Read on that group (`txbridge acls --role coordinator` "
                        "lists every ACL it needs)"
                    ) from None
                if time.monotonic() > give_up:
                    raise error from exc
                logger.warning(
                    "the committed offsets of partitions %s are not stable yet (%s): a transaction under an "
                    "id that is not a partition's holds them; waiting until it ends",
                    numbers,
                    error,
                )
                time.sleep(_ASK_AGAIN_S)

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
            state.positions_record = number in read.positions
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
