"""The brokers' clock, as the coordinator estimates it.

Every time the coordinator compares "now" with a broker timestamp (a heartbeat's append time
for liveness, a half's append time for its first check) both must be read on one clock. The
coordinator's wall clock may be off the brokers' by any amount: ahead, live producers look
dead and transactions are asked about before their check delay (a barrier then rolls back a
local transaction still running); behind, they are asked late. Kafka itself never compares
wall clocks across hosts.

:class:`BrokerClock` learns the brokers' clock from records consumed live: a record appended
at broker time ``A`` and received at local monotonic time ``M`` gives ``M - A``, which is the
offset between the two clocks plus the record's delivery delay (never less than the offset).
The least sample of a sliding window is the estimate: delivery delays and backlogs only ever
make a sample larger. ``now_ms()`` is the monotonic clock minus that offset, so once it has a
sample the coordinator's own wall clock (and a step of it) no longer matters.

Only samples known to be live may be given: a record read from a backlog (after a takeover,
or before a reader caught up) was appended long before and would make the brokers' clock
look that much behind. Without any sample the clock is the wall clock; when samples stop (no
producer heartbeats any more) the last estimate is kept.
"""

from __future__ import annotations

import logging
import time
from collections import deque

logger = logging.getLogger(__name__)

#: Samples are kept this long: the estimate follows a broker clock stepping back after this.
WINDOW_MS = 60_000
#: Samples are kept as the least of each bucket this long (so a window is a dozen numbers).
_BUCKET_MS = 5_000
#: A skew past this is logged as a warning (checks and liveness follow the brokers' clock, but
#: a clock this far off is worth fixing: logs and other tools compare wall clocks).
WARN_SKEW_MS = 5_000
_WARN_EVERY_S = 300.0


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerClock:
    """An estimate of the brokers' clock from the append times of records consumed live."""

    def __init__(self) -> None:
        # [bucket number, least sample of the bucket], oldest first
        self._buckets: deque[list[int]] = deque()
        self._offset: int | None = None  # monotonic ms - broker ms, the least sample of the window
        self._next_warning = 0.0

    def observe(self, append_ms: int | None) -> None:
        """A live record's broker append time (None for a CreateTime topic: not a sample)."""
        if append_ms is None:
            return
        mono = _mono_ms()
        sample = mono - append_ms
        bucket = mono // _BUCKET_MS
        buckets = self._buckets
        if buckets and buckets[-1][0] == bucket:
            last = buckets[-1]
            last[1] = min(last[1], sample)
            if self._offset is None or sample < self._offset:
                self._offset = sample
            return
        buckets.append([bucket, sample])
        oldest = bucket - WINDOW_MS // _BUCKET_MS
        while buckets[0][0] <= oldest:
            buckets.popleft()
        # A new bucket is the only time a sample leaves the window: recompute the least then.
        self._offset = min(least for _bucket, least in buckets)
        self._warn_if_skewed()

    def now_ms(self) -> int:
        """The brokers' clock now, in ms since the epoch (the wall clock until the first sample)."""
        offset = self._offset
        return _wall_ms() if offset is None else _mono_ms() - offset

    def now_s(self) -> float:
        """:meth:`now_ms` in seconds (a signature's timestamp)."""
        return self.now_ms() / 1000

    def skew_ms(self) -> int:
        """How far the coordinator's wall clock is ahead of the brokers' (negative: behind; 0 unknown).

        Includes the least delivery delay of the window, a millisecond or so.
        """
        return 0 if self._offset is None else _wall_ms() - self.now_ms()

    def measured(self) -> bool:
        """True once a live record gave a sample."""
        return self._offset is not None

    def _warn_if_skewed(self) -> None:
        skew = self.skew_ms()
        if abs(skew) <= WARN_SKEW_MS or time.monotonic() < self._next_warning:
            return
        self._next_warning = time.monotonic() + _WARN_EVERY_S
        logger.warning(
            "the coordinator's clock is %.1fs %s the brokers' (from the append times of live records): "
            "back-check timing and producer liveness follow the brokers' clock; fix the host's time "
            "synchronisation (NTP) all the same",
            abs(skew) / 1000,
            "ahead of" if skew > 0 else "behind",
        )
