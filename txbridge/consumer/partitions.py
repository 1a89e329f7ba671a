"""The partitions a consumer member holds: which are paused, and the offset last committed for each.

:class:`PartitionBook` is the bookkeeping alone (no client), so what gets paused,
resumed and committed is decided without a broker; :class:`Partitions` applies
those decisions to the Kafka consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import Consumer

logger = logging.getLogger(__name__)

TP = tuple[str, int]


class PartitionBook:
    """The assigned partitions, the paused ones among them, and the offset last committed for each."""

    def __init__(self) -> None:
        self.assigned: set[TP] = set()
        self.paused: set[TP] = set()
        self.last_committed: dict[TP, int] = {}

    def assign(self, tps: Iterable[TP]) -> None:
        self.assigned |= set(tps)

    def forget(self, tps: Iterable[TP]) -> None:
        """Drop ``tps`` (revoked or lost): they are no longer assigned, paused or committed here."""
        tps = set(tps)
        self.assigned -= tps
        self.paused -= tps
        for tp in tps:
            self.last_committed.pop(tp, None)

    def pause_changes(self, want_paused: Callable[[TP], bool]) -> tuple[set[TP], set[TP]]:
        """The assigned partitions to pause and the paused ones to resume, given ``want_paused``."""
        pause = {tp for tp in self.assigned if tp not in self.paused and want_paused(tp)}
        resume = {tp for tp in self.paused if not want_paused(tp)}
        return pause, resume

    def to_commit(self, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """Of ``offsets``, those of assigned partitions that differ from what was last committed."""
        return {
            tp: o for tp, o in offsets.items() if tp in self.assigned and self.last_committed.get(tp) != o
        }


class Partitions:
    """Pauses, resumes and commits on the Kafka consumer what :class:`PartitionBook` decides."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.book = PartitionBook()

    def apply_pauses(self, client: Consumer, want_paused: Callable[[TP], bool]) -> None:
        pause, resume = self.book.pause_changes(want_paused)
        if pause:
            client.pause(kafka.topic_partitions(pause))
            self.book.paused |= pause
        if resume:
            client.resume(kafka.topic_partitions(resume))
            self.book.paused -= resume

    def commit(self, client: Consumer, offsets: Mapping[TP, int]) -> None:
        """Commit those of ``offsets`` that changed; a failed commit is logged and retried next time."""
        changed = self.book.to_commit(offsets)
        if not changed:
            return
        try:
            kafka.commit_offsets(client, changed)
        except KafkaOperationError as exc:
            # A rebalance in progress: the messages stay uncommitted and are replayed, never skipped.
            logger.warning("consumer %s could not commit %s: %s", self.group, changed, exc)
            return
        self.book.last_committed.update(changed)
        logger.debug("consumer %s committed %s", self.group, changed)
