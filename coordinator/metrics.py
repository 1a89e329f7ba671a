"""The coordinator's counters, declared once, and their Prometheus export.

Every counter the coordinator keeps is a member of :class:`Stat`, with its help text; the
loop and the partition state count into one ``Counter[Stat]`` (:data:`Stats`), so a name
that is not declared is a type error (mypy), and ``/metrics`` exports every member as
``txbridge_coordinator_<name>_total``, read at scrape time (no locking in the hot path).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    # Imported where used: a coordinator without a metrics port never needs them, and they
    # cost every restart ~30 ms of start-up (more on a busy host).
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)


class Stat(StrEnum):
    """A counter: its name (``txbridge_coordinator_<name>_total``) and what it counts."""

    description: str

    def __new__(cls, name: str, description: str) -> Stat:
        member = str.__new__(cls, name)
        member._value_ = name
        member.description = description
        return member

    def __repr__(self) -> str:  # as the name it replaced: logs of dict(stats) read as before
        return repr(self.value)

    HALF_RECORDS = "half_records", "half records consumed"
    DUPLICATE_HALVES = "duplicate_halves", "half records of a transaction and sequence already held"
    LATE_HALVES = "late_halves", "half records of already resolved transactions"
    OP_RECORDS = "op_records", "op records consumed"
    DUPLICATE_OPS = "duplicate_ops", "ops repeating the decision already taken"
    CONFLICTING_OPS = "conflicting_ops", "late ops contradicting the first decision (ignored)"
    ADMIN_OPS = (
        "admin_ops",
        "txbridge admin decisions for transactions already resolved (noted; the command republishes)",
    )
    ORPHAN_OPS = "orphan_ops", "COMMITs with no half record up to the half partition's end (resolved_orphan)"
    RESOLVED_PUBLISHED = "resolved_published", "committed transactions republished"
    RESOLVED_ROLLED_BACK = "resolved_rolled_back", "transactions rolled back"
    RESOLVED_EXPIRED = "resolved_expired", "transactions expired after max_checks"
    RESOLVED_QUARANTINED = (
        "resolved_quarantined",
        "committed transactions quarantined (could not be republished)",
    )
    RESOLVED_ORPHAN = (
        "resolved_orphan",
        "decisions for halves already resolved (e.g. read back after a restart)",
    )
    MESSAGES_REPUBLISHED = "messages_republished", "messages republished to real topics"
    QUARANTINED_RECORDS = "quarantined_records", "malformed records copied to quarantine"
    HELD_FOR_KEY_ORDER = (
        "held_for_key_order",
        "ready transactions held behind an undecided one of the same key (per pass)",
    )
    CHECKS = "checks", "back-checks made (transactions asked about)"
    CHECK_REQUESTS = (
        "check_requests",
        "back-check HTTP requests sent (a request may ask about many transactions)",
    )
    CHECK_VERDICTS = "check_verdicts", "back-checks that returned COMMIT or ROLLBACK"
    CHECKS_REFUSED = "checks_refused", "check URLs refused by allowed_check_hosts"
    CHECKS_NOT_ASKED = (
        "checks_not_asked",
        "back-checks that reached no producer (no live instance, no secret, every URL refused "
        "by allowed_check_hosts or refusing the connection): "
        "not counted toward max_checks",
    )
    CHECKS_RUNNING = (
        "checks_running",
        "back-checks answered RUNNING (a live instance whose local work goes on): asked again "
        "without counting toward max_checks",
    )
    CHECKS_EXPEDITED = (
        "checks_expedited",
        "open transactions of a silent or departed writer checked before the check delay",
    )
    EXPIRED_RECHECKED = (
        "expired_rechecked",
        "expired transactions asked about again when their group came back",
    )
    EXPIRED_RESUMED = "expired_resumed", "expired transactions published after their group answered COMMIT"
    EXPIRED_ROLLED_BACK = (
        "expired_rolled_back",
        "expired transactions their returning group answered ROLLBACK",
    )
    OWNERS_FENCED = (
        "owners_fenced",
        "assigned partitions claimed: their transactional id initialised, so any earlier owner is "
        "fenced and its open transaction aborted",
    )
    PARTITIONS_FENCED = (
        "partitions_fenced",
        "owned partitions whose transactional id another owner initialised (this one was a zombie)",
    )
    PARTITIONS_KEPT = (
        "partitions_kept",
        "partitions a rebalance gave back to this coordinator, served on from memory (no claim, no restore)",
    )
    SESSIONS_LOST = (
        "sessions_lost",
        "times the group session expired and the owned partitions were dropped without a commit",
    )
    HANDOVERS = (
        "handovers",
        "clean stops of a static member that handed its partitions to the group's other members",
    )
    KAFKA_TRANSACTIONS = "kafka_transactions", "Kafka transactions committed"
    KAFKA_ABORTS = "kafka_aborts", "Kafka transactions aborted (state rewound to the committed offsets)"
    COMMIT_RETRIES = "commit_retries", "commit_transaction calls resumed after a retriable failure"
    ABORT_RETRIES = "abort_retries", "abort_transaction calls resumed after a retriable failure"
    PRODUCER_FATAL_ERRORS = (
        "producer_fatal_errors",
        "transactional producers replaced in-process after a fatal error other than fencing",
    )
    COMMITS_WEDGED = (
        "commits_wedged",
        "partition commits abandoned past their timeout; the clients were replaced",
    )
    CONSUMER_REJOINS = (
        "consumer_rejoins",
        "clients replaced in-process after a fatal error, a fenced partition or a wedged commit",
    )
    WEDGED_CALLS = (
        "wedged_calls",
        "Kafka calls still running well past their timeout (coordinator/watchdog.py)",
    )


#: The counters of one coordinator, shared by its loop and its partitions' states.
Stats: TypeAlias = Counter[Stat]


class _Collector:
    def __init__(self, stats: Stats, gauges: Callable[[], dict[str, float]]) -> None:
        self._stats, self._gauges = stats, gauges

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for stat in Stat:
            family = CounterMetricFamily(f"txbridge_coordinator_{stat}", stat.description)
            family.add_metric([], float(self._stats.get(stat, 0)))
            yield family
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(f"txbridge_coordinator_{name}", name.replace("_", " "))
            gauge.add_metric([], value)
            yield gauge


def make_registry(stats: Stats, gauges: Callable[[], dict[str, float]]) -> CollectorRegistry:
    """A private registry (several coordinators may run in one process, e.g. in tests)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, gauges))
    return registry
