"""No blocking Kafka call outlives its own timeout: a watchdog for the coordinator's loop.

librdkafka's calls take a timeout, but not every path honours it. The one seen here:
``send_offsets_to_transaction`` waits forever when the broker that is the group's
coordinator dies and drops out of the client's metadata (confluentinc/librdkafka#5511,
since librdkafka 2.9, unfixed in 2.16): after such a kill a coordinator can stay silent
for minutes, deaf to SIGTERM. Heartbeats go on from librdkafka's
own threads, so the group keeps the stuck instance's partitions and nothing of them is
published.

The calling thread cannot be interrupted and the client cannot be closed under it. What
can be done is to notice: each such call runs under :meth:`Watchdog.deadline`, and a call
still running ``grace_s`` after its timeout is reported once to ``on_wedged``. The
coordinator's CLI ends the process there (exit status :data:`EXIT_WEDGED`), so a
supervisor starts it again; restarting with the same instance id takes its partitions back
at once (static membership) and fences the stuck incarnation's open Kafka transaction.
A crash loses nothing (the crash tests kill coordinators at every step).
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: The exit status of a coordinator process ended by its watchdog (EX_TEMPFAIL: start it again).
EXIT_WEDGED = 75
#: How long past its own timeout a call may run before it counts as stuck.
GRACE_S = 10.0


@dataclass(frozen=True)
class Wedged:
    """A call still running ``overdue_s`` after its timeout: what it is, and where its thread waits."""

    what: str
    timeout_s: float
    overdue_s: float
    thread: str
    stack: str

    def __str__(self) -> str:
        return (
            f"{self.what} has not returned {self.timeout_s + self.overdue_s:.0f}s after it was called "
            f"with a {self.timeout_s:.0f}s timeout (thread {self.thread})"
        )


class WedgedCalls:
    """Where the watchdog reports a stuck call (from its thread).

    A call on a thread whose name starts with ``abandonable`` (the commit threads) is noted:
    its owner abandons it and asks for new clients (:meth:`CommitCycle.collect`). Any other
    call cannot be interrupted in-process: it is logged, and ``hook`` is called (the CLI ends
    the process there).

    Args:
        instance_id: the coordinator's instance id, for the log.
        counted: called once per report (the counter of stuck calls).
        abandonable: the name prefix of the threads whose stuck calls are abandoned.
        hook: called with any other stuck call; None: it is only logged.
    """

    def __init__(
        self,
        instance_id: str,
        counted: Callable[[], None],
        *,
        abandonable: str,
        hook: Callable[[Wedged], None] | None,
    ) -> None:
        self._instance_id = instance_id
        self._counted = counted
        self._abandonable = abandonable
        self._hook = hook
        self._threads: set[str] = set()  # the abandonable threads reported stuck

    def report(self, wedged: Wedged) -> None:
        """The watchdog's report of ``wedged`` (its thread)."""
        self._counted()
        if self.note(wedged.thread):
            logger.error("coordinator %s: %s; its clients are replaced", self._instance_id, wedged)
            return
        logger.critical(
            "coordinator %s is stuck: %s. librdkafka cannot interrupt it; %s\n%s",
            self._instance_id,
            wedged,
            "ending the process so that it starts again"
            if self._hook is not None
            else "restart this coordinator (its partitions are not served meanwhile)",
            wedged.stack,
        )
        if self._hook is not None:
            self._hook(wedged)

    def note(self, thread: str) -> bool:
        """Note ``thread`` as stuck; False if it is not an abandonable thread."""
        if not thread.startswith(self._abandonable):
            return False
        self._threads.add(thread)
        return True

    def __contains__(self, thread: object) -> bool:
        return thread in self._threads


@dataclass
class _Armed:
    what: str
    timeout_s: float
    due: float
    thread_id: int
    thread: str
    reported: bool = False


class Watchdog:
    """Reports a call that outlives its timeout by ``grace_s``; one thread watches them all.

    Args:
        on_wedged: called once per stuck call, from the watchdog's thread.
        grace_s: how long past its timeout a call may run.
        poll_s: how often the watchdog looks.
    """

    def __init__(
        self,
        on_wedged: Callable[[Wedged], None],
        *,
        grace_s: float = GRACE_S,
        poll_s: float = 0.5,
    ) -> None:
        self.on_wedged = on_wedged
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.wedged: list[Wedged] = []
        self._armed: dict[int, _Armed] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txbridge-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.poll_s * 4)

    @contextmanager
    def deadline(self, what: str, timeout_s: float) -> Iterator[None]:
        """Watch the block: it may run ``timeout_s`` (the call's own timeout) plus the grace."""
        token = next(self._ids)
        current = threading.current_thread()
        armed = _Armed(
            what, timeout_s, time.monotonic() + timeout_s + self.grace_s, current.ident or 0, current.name
        )
        with self._lock:
            self._armed[token] = armed
        try:
            yield
        finally:
            with self._lock:
                del self._armed[token]

    def check(self) -> list[Wedged]:
        """Report the calls overdue now (the thread calls this; tests may too)."""
        now = time.monotonic()
        with self._lock:
            overdue = [a for a in self._armed.values() if not a.reported and now >= a.due]
            for armed in overdue:
                armed.reported = True
        found = [self._describe(a, now) for a in overdue]
        for wedged in found:
            self.wedged.append(wedged)
            try:
                self.on_wedged(wedged)
            except Exception:  # the watchdog keeps watching whatever the callback does
                logger.exception("the watchdog's callback failed for %s", wedged.what)
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def _describe(self, armed: _Armed, now: float) -> Wedged:
        frame = sys._current_frames().get(armed.thread_id)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)\n"
        overdue = now - (armed.due - self.grace_s)
        return Wedged(armed.what, armed.timeout_s, overdue, armed.thread, stack)
