"""The pure parts behind the coordinator's gauges and histograms (coordinator/monitoring/metrics.py).

What a real coordinator serves is tested in tests/coordinator/test_metrics.py; here the
arithmetic: the age bands, the check budget, the histogram's cumulative buckets, and the
export of the labelled gauges, the histograms and the info metric as Prometheus reads it.
"""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.checks.checker import failure_kind
from coordinator.monitoring.metrics import (
    Gauge,
    Histogram,
    LabelledCounter,
    check_budget_s,
    make_registry,
    pending_by_age,
)
from coordinator.state.partition import PartitionState, PendingTx
from coordinator.state.scheduler import CheckPolicy

NOW_MS = 10_000_000


def _state(partition: int, ages_s: list[float | None], check_after_s: float | None = None) -> PartitionState:
    state = PartitionState(partition)
    for n, age in enumerate(ages_s):
        first = None if age is None else NOW_MS - int(age * 1000)
        tx = PendingTx(f"tx-{partition}-{n}", partition, first_append_ms=first, check_after_s=check_after_s)
        state.pending[tx.tx_id] = tx
    return state


def test_the_check_budget_is_the_delay_the_backoffs_and_the_timeouts() -> None:
    policy = CheckPolicy(delay_s=6.0, max_checks=15, backoff_s=5.0, backoff_max_s=60.0)

    # 6 s, then 5 + 10 + 20 + 40 and ten capped 60 s backoffs, and 15 answers of up to 5 s.
    assert check_budget_s(policy, 5.0) == 6 + 75 + 600 + 75
    assert check_budget_s(policy, 5.0, check_after_s=100.0) == 100 + 75 + 600 + 75
    assert check_budget_s(CheckPolicy(delay_s=1.0, max_checks=1), 2.0) == 1 + 2


def test_pending_transactions_are_banded_by_age_and_counted_past_their_budget() -> None:
    states = [
        _state(0, [1.0, 9.9, 10.0, 59.0, 61.0]),
        _state(1, [400.0, 3599.0, 7200.0, None]),  # None: an op record whose halves are not read yet
        _state(2, [50.0], check_after_s=100.0),  # its own, later, first check
    ]

    ages = pending_by_age(states, NOW_MS, lambda after: 45.0 if after is None else after + 45.0)

    assert ages.by_band == {"0-10s": 2, "10s-1m": 3, "1m-5m": 1, "5m-15m": 1, "15m-1h": 1, "1h+": 1}
    assert ages.oldest_s == 7200.0
    assert ages.past_budget == 5  # 59, 61, 400, 3599 and 7200 s past 45 s; not 50 s past 145 s


def test_no_pending_transaction_is_all_zeros() -> None:
    ages = pending_by_age([_state(0, [])], NOW_MS, lambda _after: 1.0)

    assert set(ages.by_band.values()) == {0}
    assert ages.oldest_s == 0.0
    assert ages.past_budget == 0


def test_the_histogram_counts_cumulatively_up_to_inf() -> None:
    histogram = Histogram("x_seconds", "x", buckets=(0.01, 0.1, 1.0))
    for seconds in (0.005, 0.01, 0.05, 0.5, 3.0, 3.0):
        histogram.observe(seconds)

    buckets, total = histogram.snapshot()

    assert buckets == [("0.01", 2.0), ("0.1", 3.0), ("1.0", 4.0), ("+Inf", 6.0)]
    assert total == pytest.approx(6.565)


def test_gauges_histograms_and_the_info_are_served_as_prometheus_reads_them() -> None:
    histogram = Histogram("commit_to_visible_seconds", "c2v", buckets=(0.1, 1.0))
    histogram.observe(0.05)
    labelled = [
        Gauge("pending_transactions_by_age", "by age", {"0-10s": 2.0, "1h+": 1.0}, "age"),
        Gauge("oldest_pending_age_seconds", "oldest", {"": 3600.5}),
    ]
    registry = make_registry(
        Counter(),
        lambda: {"ready": 1.0},
        labelled=lambda: labelled,
        histograms=[histogram],
        info={"namespace": "orders", "group": "g", "instance_id": "c1"},
    )

    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    m = "txbridge_coordinator_"
    assert samples[(f"{m}info", (("group", "g"), ("instance_id", "c1"), ("namespace", "orders")))] == 1.0
    assert samples[(f"{m}ready", ())] == 1.0
    assert samples[(f"{m}pending_transactions_by_age", (("age", "0-10s"),))] == 2.0
    assert samples[(f"{m}pending_transactions_by_age", (("age", "1h+"),))] == 1.0
    assert samples[(f"{m}oldest_pending_age_seconds", ())] == 3600.5
    assert samples[(f"{m}commit_to_visible_seconds_bucket", (("le", "0.1"),))] == 1.0
    assert samples[(f"{m}commit_to_visible_seconds_bucket", (("le", "+Inf"),))] == 1.0
    assert samples[(f"{m}commit_to_visible_seconds_count", ())] == 1.0
    assert samples[(f"{m}commit_to_visible_seconds_sum", ())] == 0.05


def test_the_check_metrics_are_served_by_group_and_failure_kind() -> None:
    latency = Histogram("check_request_seconds", "checks", buckets=(0.1, 1.0), label="group")
    failures = LabelledCounter("check_request_failures", "failed", ("group", "kind"))
    latency.observe(0.05, "orders")
    latency.observe(2.0, "orders")
    latency.observe(0.5, "refunds")
    failures.inc("orders", "timeout")

    text = generate_latest(make_registry(Counter(), dict, histograms=[latency], counters=[failures])).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    m = "txbridge_coordinator_check_request_"
    assert samples[(f"{m}seconds_count", (("group", "orders"),))] == 2.0
    assert samples[(f"{m}seconds_bucket", (("group", "orders"), ("le", "0.1")))] == 1.0
    assert samples[(f"{m}seconds_bucket", (("group", "refunds"), ("le", "1.0")))] == 1.0
    assert samples[(f"{m}seconds_sum", (("group", "refunds"),))] == 0.5
    assert samples[(f"{m}failures_total", (("group", "orders"), ("kind", "timeout")))] == 1.0
    assert not [k for k in samples if k[0] == f"{m}failures_total" and ("group", "refunds") in k[1]]
    # A labelled histogram serves no series before its first observation; an unlabelled one a zero.
    assert latency.snapshot("nobody") == ([("0.1", 0.0), ("1.0", 0.0), ("+Inf", 0.0)], 0.0)


def test_a_failed_check_request_is_counted_under_its_kind() -> None:
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1:1/check")
    kinds = {
        "timeout": httpx.ReadTimeout("slow", request=request),
        "refused": httpx.ConnectError("refused", request=request),
        "dropped": httpx.RemoteProtocolError(
            "Server disconnected without sending a response.", request=request
        ),
        "error": httpx.UnsupportedProtocol("ftp", request=request),
    }

    assert {kind: failure_kind(exc) for kind, exc in kinds.items()} == {k: k for k in kinds}
    assert failure_kind(httpx.ConnectTimeout("slow", request=request)) == "timeout"
