"""Which offset of a partition may be committed, pure.

The consumer commits the offset of the lowest message not yet finished (or one
past the highest seen when all are finished), so a crash replays every
unfinished message and never skips one: at-least-once.
"""

from __future__ import annotations


class OffsetTracker:
    """Started and finished offsets of one partition (not thread-safe; the owner locks)."""

    def __init__(self) -> None:
        self._pending: set[int] = set()
        self._next: int | None = None  # one past the highest offset started
        self._committed: int | None = None

    def start(self, offset: int) -> None:
        """A message was handed over for processing."""
        self._pending.add(offset)
        if self._next is None or offset >= self._next:
            self._next = offset + 1

    def finish(self, offset: int) -> None:
        """A message was processed (or filtered, or moved aside): it need not be replayed."""
        self._pending.discard(offset)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def committable(self) -> int | None:
        """The offset to commit: the lowest unfinished one, else one past the highest; None if none."""
        if self._pending:
            return min(self._pending)
        return self._next

    def to_commit(self) -> int | None:
        """The committable offset if it moved since the last :meth:`committed` call, else None."""
        offset = self.committable()
        if offset is None or offset == self._committed:
            return None
        return offset

    def committed(self, offset: int) -> None:
        """Record that ``offset`` was committed."""
        self._committed = offset
