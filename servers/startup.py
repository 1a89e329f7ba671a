"""How long a local server may take to start: as long as it keeps writing to its logs.

A Kafka node with a large data directory recovers its logs before it answers, minutes at
times, and says so in its log as it goes; a start-up that hangs writes nothing. So the wait
gives up after ``quiet_s`` without a new log line, not after a fixed time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

#: How often a start-up still under way says so.
NOTE_EVERY_S = 15.0


class StartupWatch:
    """Whether a starting server still makes progress, judged by the size of its log files.

    Args:
        logs: the files the server writes while it starts (missing ones count as empty).
        quiet_s: how long it may go without writing before the start counts as hung.
        what: the server, as the progress lines name it.
    """

    def __init__(self, logs: Iterable[Path], quiet_s: float, what: str) -> None:
        self.logs = list(logs)
        self.quiet_s = quiet_s
        self.what = what
        self.started = time.monotonic()
        self._size = self._written()
        self._since = self.started
        self._next_note = self.started + NOTE_EVERY_S

    def _written(self) -> int:
        return sum(path.stat().st_size for path in self.logs if path.is_file())

    def hung(self) -> bool:
        """True once the logs have not grown for ``quiet_s``; says every so often that it waits."""
        now = time.monotonic()
        size = self._written()
        if size != self._size:
            self._size, self._since = size, now
        if now >= self._next_note:
            logger.info(
                "%s is still starting (%.0fs; last log line %.0fs ago)",
                self.what,
                now - self.started,
                now - self._since,
            )
            self._next_note = now + NOTE_EVERY_S
        return now - self._since > self.quiet_s
