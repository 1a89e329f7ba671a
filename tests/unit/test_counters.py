"""The coordinator's counters are declared once (coordinator.monitoring.metrics.Stat) and all exported.

The code can count only declared counters: ``Counter[Stat]`` refuses a string index under
mypy (``make test`` runs it). These tests hold the rest together: every declared counter is
served by ``/metrics`` with its help text, the names users already scrape stay, each way
out of the pending set has its counter, and docs/coordinator.md lists exactly these.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.monitoring.metrics import Stat, make_registry
from coordinator.state import partition as state

ROOT = Path(__file__).resolve().parents[2]

#: What /metrics served before the counters were declared in one place (issue 15): scraped names.
EXPORTED_BEFORE = {
    "half_records", "op_records", "resolved_published", "resolved_rolled_back", "resolved_expired",
    "resolved_quarantined", "resolved_orphan", "messages_republished", "quarantined_records", "checks",
    "check_requests", "check_verdicts", "checks_refused", "checks_not_asked", "expired_rechecked",
    "expired_resumed", "expired_rolled_back", "checks_expedited", "owners_fenced", "conflicting_ops",
    "duplicate_ops", "late_halves", "held_for_key_order", "kafka_transactions", "kafka_aborts",
}  # fmt: skip


def _scrape(stats: Counter[Stat]) -> dict[str, tuple[str, float]]:
    """``{metric name: (help, value)}`` as a Prometheus server would read ``/metrics``."""
    registry = make_registry(stats, lambda: {"pending_transactions": 3.0, "assigned_partitions": 2.0})
    text = generate_latest(registry).decode()
    return {
        sample.name: (family.documentation, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_declared_counter_is_served_with_its_count_and_help() -> None:
    stats: Counter[Stat] = Counter({stat: n for n, stat in enumerate(Stat, start=1)})

    served = _scrape(stats)

    for stat in Stat:
        assert served[f"txbridge_coordinator_{stat}_total"] == (stat.description, stats[stat])
    counters = {name for name in served if name.endswith("_total")}
    assert len(counters) == len(Stat)
    assert served["txbridge_coordinator_pending_transactions"][1] == 3.0


def test_a_counter_never_incremented_is_served_as_zero() -> None:
    served = _scrape(Counter())

    assert {served[f"txbridge_coordinator_{stat}_total"][1] for stat in Stat} == {0.0}


def test_the_names_already_scraped_are_kept() -> None:
    assert {str(stat) for stat in Stat} >= EXPORTED_BEFORE


def test_counters_are_named_once_and_described() -> None:
    names = [str(stat) for stat in Stat]

    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z][a-z_]*[a-z]", name) for name in names)
    assert all(stat.description for stat in Stat)


def test_each_way_out_of_the_pending_set_has_its_counter() -> None:
    assert set(state._RESOLVED_STAT) == set(state.TERMINAL)
    assert {str(s) for s in state._RESOLVED_STAT.values()} == {f"resolved_{p}" for p in state.TERMINAL}


def test_the_counters_table_of_the_docs_is_the_declared_list() -> None:
    text = (ROOT / "docs" / "coordinator.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]

    listed = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)

    assert listed == [str(stat) for stat in Stat]
