"""When to back-check an undecided transaction, and when to give up. Pure: no I/O, no clock.

Timing is measured from the broker's append time of the first half record and
compared with the brokers' clock as the coordinator estimates it
(:mod:`coordinator.checks.broker_clock`), never with the producer's ``txb.ts`` (RocketMQ #9640:
producer clock skew caused spurious checks) nor with the coordinator's wall clock.

The policy sees a transaction only as :class:`Scheduled`: :mod:`coordinator.state.partition`, which
asks it when checks are due, imports it, not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Scheduled(Protocol):
    """What the policy reads and sets on a transaction (:class:`coordinator.state.partition.PendingTx`)."""

    first_append_ms: int | None
    check_after_s: float | None
    checks: int
    next_check_ms: int | None
    unasked_since_ms: int | None
    problem: str
    dirty: bool


@dataclass(frozen=True)
class CheckPolicy:
    """Back-check timing.

    Attributes:
        delay_s: seconds after the first half's append time before the first check
            (a half's ``txb.check_after`` overrides it).
        max_checks: UNKNOWN answers before the transaction expires.
        backoff_s: wait after the first UNKNOWN; doubles after each further one ...
        backoff_max_s: ... up to this cap.
        max_unasked_s: how long a transaction waits while no check can be sent at all (no
            live instance of its group, no secret, its URLs refused by the allow-list or
            refusing the connection) before it expires.
            Those attempts are not answers and do not count toward ``max_checks``.
    """

    delay_s: float = 6.0
    max_checks: int = 15
    backoff_s: float = 5.0
    backoff_max_s: float = 60.0
    max_unasked_s: float = 3600.0

    def first_due_ms(self, tx: Scheduled, now_ms: int) -> int:
        base = tx.first_append_ms if tx.first_append_ms is not None else now_ms
        delay = tx.check_after_s if tx.check_after_s is not None else self.delay_s
        return base + int(max(delay, 0.0) * 1000)

    def exhausted(self, tx: Scheduled, now_ms: int) -> bool:
        """True when ``tx`` must expire: ``max_checks`` answers, or ``max_unasked_s`` unasked."""
        if tx.checks >= self.max_checks:
            return True
        since = tx.unasked_since_ms
        return since is not None and now_ms - since >= self.max_unasked_s * 1000

    def unasked_retry_ms(self, waited_ms: int) -> int:
        """Wait before trying again to check a transaction that nobody could be asked about
        for ``waited_ms``: as long again, at least 0.5 s, at most ``backoff_s``.

        Most often its group is restarting: the killed instance's URL refuses and its
        replacement registers within a second or two, and the transactions behind it in key
        order wait for this retry, which a flat ``backoff_s`` would hold back. A group that
        stays unreachable is tried every ``backoff_s``.
        """
        return int(min(max(waited_ms, 500), self.backoff_s * 1000))

    def backoff_ms(self, checks_done: int) -> int:
        """Wait after the ``checks_done``-th UNKNOWN answer (1-based): growing, capped."""
        exponent = max(checks_done - 1, 0)
        return int(min(self.backoff_s * (2 ** min(exponent, 30)), self.backoff_max_s) * 1000)


__all__ = ["CheckPolicy", "Scheduled", "record_not_asked", "record_running", "record_unknown"]


def record_unknown(policy: CheckPolicy, tx: Scheduled, now_ms: int) -> bool:
    """Count an UNKNOWN (or failed) check and reschedule. Returns True when ``tx`` must expire now."""
    tx.checks += 1
    tx.unasked_since_ms, tx.problem = None, ""
    tx.dirty = True
    if tx.checks >= policy.max_checks:
        tx.next_check_ms = now_ms
        return True
    tx.next_check_ms = now_ms + policy.backoff_ms(tx.checks)
    return False


def record_not_asked(policy: CheckPolicy, tx: Scheduled, now_ms: int, why: str) -> bool:
    """A check that could not be sent (``why``): reschedule without using up ``max_checks``.

    Returns True when ``tx`` has waited ``max_unasked_s`` without any check being sent and
    must expire now.
    """
    if tx.unasked_since_ms is None:
        tx.unasked_since_ms = now_ms
    tx.problem = why
    tx.dirty = True
    if now_ms - tx.unasked_since_ms >= policy.max_unasked_s * 1000:
        tx.next_check_ms = now_ms
        return True
    tx.next_check_ms = now_ms + policy.unasked_retry_ms(now_ms - tx.unasked_since_ms)
    return False


def record_running(policy: CheckPolicy, tx: Scheduled, now_ms: int) -> None:
    """A RUNNING answer: a live instance says the local work goes on. Reschedule without using
    up ``max_checks`` (an UNKNOWN does), ``backoff_max_s`` later: the writer's own op record
    normally ends it first, and a writer that dies stops answering, which brings back the
    bounded paths (UNKNOWN answers, or ``max_unasked_s`` unasked).
    """
    tx.unasked_since_ms, tx.problem = None, ""
    tx.dirty = True
    tx.next_check_ms = now_ms + int(policy.backoff_max_s * 1000)
