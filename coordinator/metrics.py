"""Prometheus metrics: the loop's counters, read at scrape time (no locking in the hot path)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

#: Counter names and what they count (``txbridge_coordinator_<name>_total``).
COUNTERS = {
    "half_records": "half records consumed",
    "op_records": "op records consumed",
    "resolved_published": "committed transactions republished",
    "resolved_rolled_back": "transactions rolled back",
    "resolved_expired": "transactions expired after max_checks",
    "resolved_quarantined": "committed transactions quarantined (could not be republished)",
    "resolved_orphan": "decisions for halves already resolved (e.g. read back after a restart)",
    "messages_republished": "messages republished to real topics",
    "quarantined_records": "malformed records copied to quarantine",
    "checks": "back-checks made (transactions asked about)",
    "check_requests": "back-check HTTP requests sent (a request may ask about many transactions)",
    "check_verdicts": "back-checks that returned COMMIT or ROLLBACK",
    "checks_refused": "check URLs refused by allowed_check_hosts",
    "checks_not_asked": "back-checks that could not be sent (no live instance, no secret, every URL "
    "refused): not counted toward max_checks",
    "expired_rechecked": "expired transactions asked about again when their group came back",
    "expired_resumed": "expired transactions published after their group answered COMMIT",
    "expired_rolled_back": "expired transactions their returning group answered ROLLBACK",
    "checks_expedited": "open transactions of a silent or departed writer checked before the check delay",
    "owners_fenced": "dead previous owners of assigned partitions fenced (their open transaction aborted)",
    "conflicting_ops": "late ops contradicting the first decision (ignored)",
    "duplicate_ops": "ops repeating the decision already taken",
    "late_halves": "half records of already resolved transactions",
    "held_for_key_order": "ready transactions held behind an undecided one of the same key (per pass)",
    "kafka_transactions": "Kafka transactions committed",
    "kafka_aborts": "Kafka transactions aborted (state rewound to the committed offsets)",
}


class _Collector:
    def __init__(self, stats: Counter[str], gauges: Callable[[], dict[str, float]]) -> None:
        self._stats, self._gauges = stats, gauges

    def collect(self) -> Iterator[Any]:
        for name, help_text in COUNTERS.items():
            family = CounterMetricFamily(f"txbridge_coordinator_{name}", help_text)
            family.add_metric([], float(self._stats.get(name, 0)))
            yield family
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(f"txbridge_coordinator_{name}", name.replace("_", " "))
            gauge.add_metric([], value)
            yield gauge


def make_registry(stats: Counter[str], gauges: Callable[[], dict[str, float]]) -> CollectorRegistry:
    """A private registry (several coordinators may run in one process, e.g. in tests)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, gauges))
    return registry


def serve(registry: CollectorRegistry, port: int) -> Any:
    """Serve ``/metrics`` on ``port``; returns the server (``shutdown()`` it on exit)."""
    server, _thread = start_http_server(port, registry=registry)
    logger.info("metrics on http://0.0.0.0:%d/metrics", port)
    return server
