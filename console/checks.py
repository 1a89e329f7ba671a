"""The back-checks of each producer group as the coordinators count them: requests, failures by
kind, latency.

These figures live only in the coordinators' memory: each counts the check requests it sent
(``txbridge_coordinator_check_request_seconds{group}``, a histogram) and those that got no
answer (``txbridge_coordinator_check_request_failures_total{group, kind}``) since it started.
The console scrapes their ``/metrics`` when told where (:class:`ConsoleSettings.coordinator_metrics`):
at each member of the coordinators' group on a port, or at URLs given. Each scrape has a short
timeout and runs beside the others; one that fails is named on the page as unavailable, and the
page is shown with the figures of the others, or without any.

:func:`parse`, :func:`merge` and :func:`quantile` are pure, tested without a coordinator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from console.health import Member
from console.security import shown_url

__all__ = ["ChecksRead", "GroupChecks", "merge", "metrics_urls", "parse", "quantile", "read_checks"]

logger = logging.getLogger(__name__)

#: Seconds a scrape of one coordinator may take: the page waits for the slowest.
SCRAPE_TIMEOUT_S = 2.0
_SCRAPERS = 8
_PREFIX = "txbridge_coordinator_"
_LATENCY = f"{_PREFIX}check_request_seconds"
_FAILURES = f"{_PREFIX}check_request_failures_total"
#: The failure kinds in the order a page lists them (the coordinator's ``failure_kind``).
KINDS = ("timeout", "refused", "dropped", "http_error", "error")


@dataclass
class GroupChecks:
    """One producer group's back-check requests, summed over the coordinators read."""

    requests: float = 0.0
    seconds: float = 0.0  # their total time
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    failures: dict[str, float] = field(default_factory=dict)  # kind -> requests

    @property
    def failed(self) -> float:
        return sum(self.failures.values())

    @property
    def answered(self) -> float:
        """Requests a producer answered with a status 200: COMMIT, ROLLBACK or UNKNOWN alike."""
        return max(0.0, self.requests - self.failed)

    @property
    def mean_s(self) -> float | None:
        return self.seconds / self.requests if self.requests else None

    def quantile(self, q: float) -> float | None:
        return quantile(q, self.buckets)

    @property
    def slowest_below_s(self) -> float | None:
        """The smallest bucket bound every request took less than (None: none, or one past the last bound)."""
        if not self.requests:
            return None
        return next(
            (b for b, n in sorted(self.buckets.items()) if n >= self.requests and b != float("inf")), None
        )

    def failure_list(self) -> list[tuple[str, int]]:
        known = [(k, int(self.failures[k])) for k in KINDS if self.failures.get(k)]
        return known + sorted((k, int(n)) for k, n in self.failures.items() if k not in KINDS and n)


@dataclass
class ChecksRead:
    """What the scrapes gave: the groups' figures, and which coordinators were read or not."""

    configured: bool = False  # the console was told where the coordinators' metrics are
    by_group: dict[str, GroupChecks] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)  # the metrics URLs read
    unavailable: list[tuple[str, str]] = field(default_factory=list)  # (URL, why)


def parse(text: str) -> tuple[str | None, dict[str, GroupChecks]]:
    """The namespace a coordinator's ``/metrics`` text names, and its check figures by group.

    Raises:
        ValueError: the text is not the Prometheus text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    namespace = None
    groups: dict[str, GroupChecks] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{_PREFIX}info":
                namespace = s.labels.get("namespace", namespace)
                continue
            group = s.labels.get("group")
            if group is None:
                continue
            if s.name == f"{_LATENCY}_count":
                groups.setdefault(group, GroupChecks()).requests += s.value
            elif s.name == f"{_LATENCY}_sum":
                groups.setdefault(group, GroupChecks()).seconds += s.value
            elif s.name == f"{_LATENCY}_bucket":
                bound = float(s.labels["le"])
                buckets = groups.setdefault(group, GroupChecks()).buckets
                buckets[bound] = buckets.get(bound, 0.0) + s.value
            elif s.name == _FAILURES:
                kind = s.labels.get("kind", "error")
                failures = groups.setdefault(group, GroupChecks()).failures
                failures[kind] = failures.get(kind, 0.0) + s.value
    return namespace, groups


def merge(parts: Iterable[Mapping[str, GroupChecks]]) -> dict[str, GroupChecks]:
    """The figures of several coordinators summed by group (as Prometheus's ``sum by (group, le)``)."""
    out: dict[str, GroupChecks] = {}
    for part in parts:
        for group, one in part.items():
            into = out.setdefault(group, GroupChecks())
            into.requests += one.requests
            into.seconds += one.seconds
            for bound, n in one.buckets.items():
                into.buckets[bound] = into.buckets.get(bound, 0.0) + n
            for kind, n in one.failures.items():
                into.failures[kind] = into.failures.get(kind, 0.0) + n
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of cumulative buckets, interpolated within its bucket as Prometheus's
    ``histogram_quantile`` does (in the ``+Inf`` bucket: the highest finite bound)."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def metrics_urls(where: Sequence[str], members: Sequence[Member]) -> list[str]:
    """The metrics URLs of a namespace's coordinators: ``where`` holds URLs, or a port that each
    member of the coordinators' group (its host as the broker saw its connection) serves on."""
    urls: list[str] = []
    for one in where:
        if one.isdigit():
            for m in members:
                if m.host:
                    host = f"[{m.host}]" if ":" in m.host else m.host
                    urls.append(f"http://{host}:{one}/metrics")
        else:
            urls.append(one)
    return list(dict.fromkeys(urls))


def _scrape(url: str, namespace: str) -> tuple[dict[str, GroupChecks] | None, str]:
    import httpx

    try:
        response = httpx.get(url, timeout=SCRAPE_TIMEOUT_S, follow_redirects=False)
    except httpx.HTTPError as exc:
        return None, type(exc).__name__
    if response.status_code != 200:
        return None, f"HTTP {response.status_code}"
    try:
        serves, groups = parse(response.text)
    except ValueError:
        return None, "not Prometheus metrics"
    if serves is not None and serves != namespace:
        return None, f"a coordinator of namespace {serves}, not {namespace}"
    return groups, ""


def read_checks(urls: Sequence[str], namespace: str) -> ChecksRead:
    """Scrape ``urls`` side by side; the groups' figures summed over those that answered."""
    read = ChecksRead(configured=True)
    if not urls:
        return read
    with ThreadPoolExecutor(
        max_workers=min(_SCRAPERS, len(urls)), thread_name_prefix="console-scrape"
    ) as pool:
        results = list(pool.map(lambda u: _scrape(u, namespace), urls))
    parts = []
    for url, (groups, why) in zip(urls, results, strict=True):
        shown = shown_url(url)  # a URL given with credentials or a token is shown without
        if groups is None:
            logger.info("console: coordinator metrics at %s unavailable: %s", shown, why)
            read.unavailable.append((shown, why))
        else:
            read.read.append(shown)
            parts.append(groups)
    read.by_group = merge(parts)
    return read
