"""The assignments the group made and the loop has not taken over yet: the rebalance callbacks' side.

librdkafka runs the rebalance callbacks inside the consumer's poll. The assignment callback only
records what it was given here (:meth:`Assignments.give`) and the coordinator's loop takes the
recorded assignments over right after the poll returns (:meth:`Rebalancer.take_over_queued`):
claiming, restoring and placing the partitions is the loop's work, as aiokafka and quix-streams
keep their rebalance listeners thin. Meanwhile the given partitions are assigned to the consumer
paused: a callback that assigns nothing lets the client assign them itself and fetch from the
group's committed offsets, which are only a copy for monitoring (the positions are in
``<ns>_state``). The take-over resumes them and seeks them to their positions.

A revocation or a loss of partitions still queued cancels them (:meth:`Assignments.cancel`):
they were never claimed, and nothing of them was served.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from txbridge import kafka
from txbridge.kafka import Consumer, TopicPartition
from txbridge.wire import Topics


@dataclass
class TakeOver:
    """One assignment for the loop to take over.

    Attributes:
        partitions: what the group gave (let go of if the take-over gives up).
        numbers: the partition numbers to serve: both their half and their op partition given.
    """

    partitions: list[TopicPartition]
    numbers: list[int]


class Assignments:
    """The partitions given to the consumer, and the take-overs queued for the loop.

    Args:
        topics: the namespace's topics.
        incremental: the consumer protocol (KIP-848) moves partitions incrementally: the
            callbacks get only the moved ones; the classic protocol's eager rebalances revoke
            and assign the whole assignment.
    """

    def __init__(self, topics: Topics, *, incremental: bool) -> None:
        self.topics = topics
        self.incremental = incremental
        # Incremental only: the half and op partitions the group has given and not taken back,
        # all of them assigned to the consumer (paused until their number is taken over).
        self._given: set[tuple[str, int]] = set()
        self._queued: list[TakeOver] = []

    def give(self, consumer: Consumer, partitions: list[TopicPartition], served: Container[int]) -> TakeOver:
        """The group gave ``partitions``: assign them to ``consumer`` paused, and queue their take-over.

        Eager: ``partitions`` is the whole assignment. Incremental: only what was added; a
        partition number is taken over once the group has given both its half and its op
        partition (the broker's range assignor gives them together) and it is neither
        ``served`` nor queued already.
        """
        # At the beginning, not at the group's committed offsets: that needs no request to the
        # group coordinator before the fetchers start, and the take-over seeks them before any
        # record is fetched (they are paused until then).
        placed = [kafka.partition_at(tp.topic, tp.partition, kafka.OFFSET_BEGINNING) for tp in partitions]
        if self.incremental:
            self._given |= {(tp.topic, tp.partition) for tp in partitions}
            queued = self.queued()
            numbers = sorted(
                n
                for t, n in self._given
                if t == self.topics.half
                and (self.topics.op, n) in self._given
                and n not in served
                and n not in queued
            )
            consumer.incremental_assign(placed)
        else:
            numbers = sorted({tp.partition for tp in partitions if tp.topic == self.topics.half})
            consumer.assign(placed)
        if placed:
            consumer.pause(placed)
        event = TakeOver(list(partitions), numbers)
        self._queued.append(event)
        return event

    def take(self) -> list[TakeOver]:
        """The queued take-overs, oldest first; the queue is emptied."""
        taken, self._queued = self._queued, []
        return taken

    def pending(self) -> bool:
        """Whether a take-over is queued."""
        return bool(self._queued)

    def queued(self) -> set[int]:
        """The partition numbers of the queued take-overs."""
        return {n for event in self._queued for n in event.numbers}

    def cancel(self, partitions: list[TopicPartition]) -> None:
        """``partitions`` are revoked or lost: nothing of them is taken over.

        Eager: the queued assignment goes whole (the group revokes every partition). Incremental:
        the queued take-overs lose the numbers of ``partitions`` (a number whose half or op
        partition goes is not whole any more) and the partitions themselves.
        """
        if not self.incremental:
            self._queued = []
            return
        going = {tp.partition for tp in partitions}
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for event in self._queued:
            event.numbers = [n for n in event.numbers if n not in going]
            event.partitions = [tp for tp in event.partitions if (tp.topic, tp.partition) not in gone]

    def let_go(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Incremental: stop reading ``partitions`` (the group took them back)."""
        going = {(tp.topic, tp.partition) for tp in partitions}
        assigned = sorted(going & self._given)
        self._given -= going
        if assigned:
            consumer.incremental_unassign([kafka.partition_at(t, n) for t, n in assigned])

    def reset(self) -> None:
        """Forget everything: the consumer is being replaced."""
        self._given = set()
        self._queued = []
