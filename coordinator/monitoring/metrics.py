"""The coordinator's counters, declared once, and their Prometheus export.

Every counter the coordinator keeps is a member of :class:`Stat`, with its help text; the
loop and the partition state count into one ``Counter[Stat]`` (:data:`Stats`), so a name
that is not declared is a type error (mypy), and ``/metrics`` exports every member as
``txbridge_coordinator_<name>_total``, read at scrape time (no locking in the hot path).

Beside them: gauges read at scrape time (:class:`Gauge`, labelled or not), the few
latencies kept as histograms (:class:`Histogram`: a bisect and two additions an
observation), the back-checks' failures by group and kind (:class:`LabelledCounter`),
``txbridge_coordinator_info`` naming the coordinator's namespace, group and
instance (dashboards and alerts join on it), and :func:`pending_by_age`, the ages of the
pending transactions computed from the states at scrape time. The dashboard and the alert
rules of ``compose/`` use these names; ``docs/operations.md`` says what each alert means.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    # Imported where used: a coordinator without a metrics port never needs them, and they
    # would slow every restart.
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
    CHECKS_UNKNOWN = (
        "checks_unknown",
        "back-checks answered UNKNOWN or failed (an error, a timeout, a bad answer): count toward max_checks",
    )
    CHECKS_REFUSED = "checks_refused", "check URLs refused by allowed_check_hosts"
    CHECKS_NOT_ASKED = (
        "checks_not_asked",
        "back-checks that reached no producer (no live instance, no secret, every URL refused "
        "by allowed_check_hosts or refusing the connection): "
        "not counted toward max_checks",
    )
    CHECKS_AWAITING_WRITER = (
        "checks_awaiting_writer",
        "back-checks not sent because the writer is gone and no live instance of its group answers "
        "for its check source (another database, or a check that answers for its own instance "
        "only): the transaction waits for the writer, then expires after max_unasked_s",
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
        "assigned partitions claimed: the earlier owner their claim record names (unless it "
        "released them) fenced and its open transaction aborted",
    )
    PARTITIONS_FENCED = (
        "partitions_fenced",
        "commits refused because another owner fenced this coordinator's transactional id (a zombie)",
    )
    PARTITIONS_KEPT = (
        "partitions_kept",
        "partitions a rebalance gave back to this coordinator, served on from memory (no claim, no restore)",
    )
    STALE_RECORDS = (
        "stale_records",
        "records fetched before a rebalance and returned after it: not applied, read again from "
        "their partition's position",
    )
    SESSIONS_LOST = (
        "sessions_lost",
        "times the group session expired and the owned partitions were dropped without a commit",
    )
    REBALANCES = (
        "rebalances",
        "assignments the group gave this coordinator (one per rebalance it took part in)",
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
        "Kafka calls still running well past their timeout (coordinator/monitoring/watchdog.py)",
    )


#: The counters of one coordinator, shared by its loop and its partitions' states.
Stats: TypeAlias = Counter[Stat]


@dataclass(frozen=True)
class Gauge:
    """A gauge read at scrape time: one value per label value (``label`` empty: one value, key "")."""

    name: str
    description: str
    values: Mapping[str, float]
    label: str = ""


#: Upper bounds (seconds) of the latency histograms: a millisecond to a minute.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """A Prometheus histogram, kept without prometheus_client (imported only to serve it).

    Observed on the loop's and the checker's threads: a lock, a bisect and two additions.
    With a ``label``, one series per label value (``observe(seconds, value)``), made at its
    first observation; the label's values must be few (a producer group's name, say), each
    is a series of every bucket. Without one, the single series is served from the start.
    """

    def __init__(
        self, name: str, description: str, buckets: Sequence[float] = LATENCY_BUCKETS, *, label: str = ""
    ) -> None:
        self.name, self.description, self.label = name, description, label
        self.buckets = tuple(sorted(buckets))
        # per label value: the counts (the last: above every bound, +Inf) and the sum
        self._series: dict[str, tuple[list[int], list[float]]] = {} if label else {"": self._new()}
        self._lock = threading.Lock()

    def _new(self) -> tuple[list[int], list[float]]:
        return [0] * (len(self.buckets) + 1), [0.0]

    def observe(self, seconds: float, value: str = "") -> None:
        with self._lock:
            counts, total = self._series.get(value) or self._series.setdefault(value, self._new())
            counts[bisect.bisect_left(self.buckets, seconds)] += 1
            total[0] += seconds

    def values(self) -> list[str]:
        """The label values observed so far (``[""]`` without a label)."""
        with self._lock:
            return sorted(self._series)

    def snapshot(self, value: str = "") -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` buckets, ``+Inf`` last, and the sum of the observations
        (of one label value; all zero for one not observed)."""
        with self._lock:
            counts, total = self._series.get(value) or self._new()
            counts, seconds = list(counts), total[0]
        cumulative, running = [], 0
        for bound, count in zip((*map(_bound, self.buckets), "+Inf"), counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return cumulative, seconds


class LabelledCounter:
    """A counter with labels (``txbridge_coordinator_<name>_total``), counted from any thread.

    A series is made at its first count; the labels' values must be few.
    """

    def __init__(self, name: str, description: str, labels: Sequence[str]) -> None:
        self.name, self.description, self.labels = name, description, tuple(labels)
        self._counts: Counter[tuple[str, ...]] = Counter()
        self._lock = threading.Lock()

    def inc(self, *values: str) -> None:
        assert len(values) == len(self.labels), (values, self.labels)
        with self._lock:
            self._counts[values] += 1

    def counts(self) -> dict[tuple[str, ...], int]:
        with self._lock:
            return dict(self._counts)


def _bound(value: float) -> str:
    return repr(float(value))


class Aged(Protocol):
    """What :func:`pending_by_age` reads of a pending transaction
    (:class:`coordinator.state.partition.PendingTx`)."""

    first_append_ms: int | None
    check_after_s: float | None


class Held(Protocol):
    """What :func:`pending_by_age` reads of a partition's state."""

    @property
    def pending(self) -> Mapping[str, Any]: ...


#: Upper bounds (seconds) of the pending-by-age bands, and each band's label.
AGE_BANDS: tuple[tuple[float, str], ...] = (
    (10.0, "0-10s"),
    (60.0, "10s-1m"),
    (300.0, "1m-5m"),
    (900.0, "5m-15m"),
    (3600.0, "15m-1h"),
    (float("inf"), "1h+"),
)


@dataclass
class PendingAges:
    """The ages of the pending transactions of the owned partitions (those with a half record)."""

    by_band: dict[str, float] = field(default_factory=lambda: {label: 0.0 for _, label in AGE_BANDS})
    oldest_s: float = 0.0
    past_budget: int = 0


def pending_by_age(
    states: Iterable[Held], now_ms: int, budget_s: Callable[[float | None], float]
) -> PendingAges:
    """Band the pending transactions by the age of their first half; count those past their budget.

    Called on the scrape thread while the loop changes the states: each pending set is copied
    first (one C-level call, atomic under the GIL), so the walk never sees a dict change size.
    ``budget_s(check_after_s)`` is a transaction's check budget (:func:`check_budget_s`).
    The append times are gathered by comprehensions and sorted, and the bands counted by
    bisection: a Python step per transaction with a ``check_after`` of its own only (rare).
    """
    firsts: list[int] = []  # first half's append time of those on the coordinator's check delay
    own: list[tuple[int, float]] = []  # (append time, check_after_s) of those with their own
    for state in list(states):
        txs = list(state.pending.values())
        # An op record with no half yet has no append time: its age is not known.
        firsts += [
            t.first_append_ms for t in txs if t.first_append_ms is not None and t.check_after_s is None
        ]
        own += [
            (t.first_append_ms, t.check_after_s)
            for t in txs
            if t.first_append_ms is not None and t.check_after_s is not None
        ]
    firsts.sort()
    ages = PendingAges()
    younger = 0  # of firsts, those younger than the band's lower bound
    for bound, label in AGE_BANDS:
        below = (
            len(firsts)
            if bound == float("inf")
            else len(firsts) - bisect.bisect_right(firsts, now_ms - bound * 1000)
        )
        ages.by_band[label] = float(below - younger)
        younger = below
    if firsts:
        ages.oldest_s = max(now_ms - firsts[0], 0) / 1000
        ages.past_budget = bisect.bisect_left(firsts, now_ms - budget_s(None) * 1000)
    budgets: dict[float, float] = {}
    for appended, after in own:
        age = max(now_ms - appended, 0) / 1000
        ages.oldest_s = max(ages.oldest_s, age)
        ages.by_band[next(label for bound, label in AGE_BANDS if age < bound)] += 1
        if after not in budgets:
            budgets[after] = budget_s(after)
        ages.past_budget += age > budgets[after]
    return ages


class Policy(Protocol):
    """What :func:`check_budget_s` reads of :class:`coordinator.state.scheduler.CheckPolicy`."""

    @property
    def delay_s(self) -> float: ...

    @property
    def max_checks(self) -> int: ...

    def backoff_ms(self, checks_done: int) -> int: ...


def check_budget_s(policy: Policy, check_timeout_s: float, check_after_s: float | None = None) -> float:
    """How long a transaction stays pending at most when every back-check answers UNKNOWN.

    The first check's delay, the backoffs between ``max_checks`` answers and each answer's
    timeout. A transaction still pending past it is not being checked (nobody to ask: it
    waits up to ``max_unasked_s``) or is decided but not republished: either way stuck.
    """
    delay = policy.delay_s if check_after_s is None else max(check_after_s, 0.0)
    backoffs = sum(policy.backoff_ms(k) for k in range(1, policy.max_checks)) / 1000
    return delay + backoffs + policy.max_checks * check_timeout_s


class _Collector:
    def __init__(
        self,
        stats: Stats,
        gauges: Callable[[], dict[str, float]],
        labelled: Callable[[], list[Gauge]],
        histograms: Sequence[Histogram],
        info: Mapping[str, str],
        *,
        counters: Sequence[LabelledCounter] = (),
    ) -> None:
        self._stats, self._gauges, self._labelled = stats, gauges, labelled
        self._histograms, self._info, self._counters = histograms, info, counters

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        if self._info:
            info = InfoMetricFamily("txbridge_coordinator", "the coordinator's namespace, group and instance")
            info.add_metric([], dict(self._info))
            yield info
        for stat in Stat:
            family = CounterMetricFamily(f"txbridge_coordinator_{stat}", stat.description)
            family.add_metric([], float(self._stats.get(stat, 0)))
            yield family
        for counter in self._counters:
            family = CounterMetricFamily(
                f"txbridge_coordinator_{counter.name}", counter.description, labels=counter.labels
            )
            for values, count in sorted(counter.counts().items()):
                family.add_metric(list(values), float(count))
            yield family
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(f"txbridge_coordinator_{name}", name.replace("_", " "))
            gauge.add_metric([], value)
            yield gauge
        for one in self._labelled():
            labels = [one.label] if one.label else []
            gauge = GaugeMetricFamily(f"txbridge_coordinator_{one.name}", one.description, labels=labels)
            for key, value in one.values.items():
                gauge.add_metric([key] if one.label else [], value)
            yield gauge
        for histogram in self._histograms:
            labels = [histogram.label] if histogram.label else []
            latency = HistogramMetricFamily(
                f"txbridge_coordinator_{histogram.name}", histogram.description, labels=labels
            )
            for label_value in histogram.values():
                buckets, total = histogram.snapshot(label_value)
                latency.add_metric([label_value] if labels else [], buckets, total)
            yield latency


def make_registry(
    stats: Stats,
    gauges: Callable[[], dict[str, float]],
    *,
    labelled: Callable[[], list[Gauge]] = list,
    histograms: Sequence[Histogram] = (),
    info: Mapping[str, str] | None = None,
    counters: Sequence[LabelledCounter] = (),
) -> CollectorRegistry:
    """A private registry (several coordinators may run in one process, e.g. in tests).

    Args:
        stats: the counters.
        gauges: unlabelled gauges by name, read at each scrape.
        labelled: more gauges, read at each scrape (labelled or with their own help text).
        histograms: the latencies.
        info: the labels of ``txbridge_coordinator_info`` (none: not served).
        counters: the labelled counters (beside the :class:`Stat` ones).
    """
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, gauges, labelled, histograms, info or {}, counters=counters))
    return registry
