"""compose/'s alert rules and Grafana dashboard: valid, tested, and about metrics that exist.

``promtool`` (Debian's ``prometheus`` package; ``scripts/system-packages.sh`` installs it)
checks the rules and runs their unit tests (``compose/prometheus/alerts.test.yml``: each alert
fires on bad series and stays silent on good ones). The dashboard is checked structurally: its
panels query metrics the coordinator declares, through the datasource Grafana is provisioned
with. That every name the rules and the dashboard use is served by a running coordinator is
checked against a real one in tests/coordinator/test_metrics.py (:func:`names_used`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.monitoring.metrics import Stat

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "compose" / "prometheus"
GRAFANA = ROOT / "compose" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "txbridge.json"
ALERTS = PROMETHEUS / "alerts.yml"

_METRIC = re.compile(r"\btxbridge_coordinator_[a-z_]+\b")
#: The alerts the issue asks for, by what they watch.
EXPECTED_ALERTS = {
    "TxbridgeTransactionPastCheckBudget",
    "TxbridgeTransactionsExpired",
    "TxbridgeChecksFailing",
    "TxbridgeNamespaceWithoutReadyCoordinator",
    "TxbridgeStateLastStableOffsetStuck",
}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # those of a collapsed row
    return out


def queries() -> list[str]:
    """Every PromQL expression of the rules and the dashboard (its template variables too)."""
    exprs = [rule["expr"] for rule in alert_rules()]
    board = dashboard()
    exprs += [target["expr"] for panel in panels(board) for target in panel.get("targets", [])]
    exprs += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
              for v in board["templating"]["list"] if v["type"] == "query"]  # fmt: skip
    return exprs


def names_used() -> set[str]:
    """The sample names the rules and the dashboard query (``_bucket`` and such included)."""
    return {name for expr in queries() for name in _METRIC.findall(expr)}


def promtool() -> str:
    """promtool's path; skips the test without it, except in CI (``CI=true``), where it fails."""
    found = shutil.which("promtool")
    if found is None:
        install = "install Debian's prometheus package (scripts/system-packages.sh, run by make setup)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"promtool is missing: {install}")
        pytest.skip(f"promtool is not installed: {install}")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False, cwd=PROMETHEUS)


# ------------------------------------------------------------------ the alert rules


def test_the_alert_rules_pass_promtool_check() -> None:
    result = _run(promtool(), "check", "rules", "alerts.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_every_alert_fires_and_stays_silent_in_promtools_unit_tests() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())
    tested = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"]}
    fired = {
        case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case["exp_alerts"]
    }
    silent = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if not case["exp_alerts"]
    }

    result = _run(promtool(), "test", "rules", "alerts.test.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    names = {rule["alert"] for rule in alert_rules()}
    assert names == EXPECTED_ALERTS
    assert tested == fired == silent == names


def test_a_broken_rule_fails_promtool(tmp_path: Path) -> None:
    """The check can fail: a rule with a PromQL error is refused."""
    broken = tmp_path / "alerts.yml"
    broken.write_text(ALERTS.read_text().replace("> 180", "> > 180", 1))

    result = _run(promtool(), "check", "rules", str(broken))

    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_says_what_to_do_and_links_its_runbook() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", operations, flags=re.MULTILINE)}

    for rule in alert_rules():
        assert rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path == "docs/operations.md"
        assert anchor in anchors, f"{rule['alert']}: docs/operations.md has no section #{anchor}"


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# ------------------------------------------------------------------ the dashboard


def declared_names() -> set[str]:
    """The names the coordinator declares: its counters and the gauges and histograms of the docs."""
    names = {f"txbridge_coordinator_{stat}_total" for stat in Stat}
    text = (ROOT / "docs" / "coordinator.md").read_text()
    section = text.split("## Gauges and histograms", 1)[1].split("\n## ", 1)[0]
    for name, histogram in re.findall(r"^\| `([a-z_]+)[^`]*`( \(histogram\))?", section, flags=re.MULTILINE):
        full = f"txbridge_coordinator_{name}"
        names |= {f"{full}_bucket", f"{full}_sum", f"{full}_count"} if histogram else {full}
    # "`assigned_partitions` / `unserved_partitions`": two names on one row
    names |= {f"txbridge_coordinator_{n}" for n in re.findall(r"^\| `[a-z_]+` / `([a-z_]+)`", section, re.M)}
    return names


def test_the_dashboard_queries_only_declared_metrics() -> None:
    assert names_used() <= declared_names(), sorted(names_used() - declared_names())


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    titles = " / ".join(p["title"].lower() for p in panels(dashboard()))

    for subject in ("throughput", "commit-to-visible", "pending by age", "checks", "expir", "quarantine",
                    "rebalances", "sessions lost", "ready", "last stable offset"):  # fmt: skip
        assert subject in titles, f"no panel about {subject}: {titles}"


def test_every_panel_queries_through_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = provisioned["datasources"]
    board = dashboard()

    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    graphs = [p for p in panels(board) if p["type"] != "row"]
    assert graphs
    ids = [p["id"] for p in panels(board)]
    assert len(set(ids)) == len(ids)
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
            assert _METRIC.search(target["expr"]), f"{panel['title']}: {target['expr']}"
            assert _balanced(target["expr"]), f"{panel['title']}: {target['expr']}"
    for variable in board["templating"]["list"]:
        assert variable["datasource"]["uid"] == source["uid"]


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, with Grafana's variables given values, parsed by promtool (as a rule)."""
    board = dashboard()
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    grafana_vars = {"$__rate_interval": "1m", "$namespace": ".*"}
    rules = []
    for n, expr in enumerate(exprs):
        query = expr
        for variable, value in grafana_vars.items():
            query = query.replace(variable, value)
        assert "$" not in query, query
        rules.append({"record": f"txbridge:dashboard_query_{n}", "expr": query})
    groups = {"groups": [{"name": "dashboard", "rules": rules}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(groups))

    result = _run(promtool(), "check", "rules", str(tmp_path / "dashboard.yml"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def _balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_grafana_loads_the_dashboard_from_where_it_is_mounted() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "txbridge.yml").read_text())
    (entry,) = provider["providers"]
    board = dashboard()

    assert entry["type"] == "file"
    assert entry["options"]["path"] == "/var/lib/grafana/dashboards"
    assert board["uid"]
    assert board["title"]
    assert board["schemaVersion"] >= 36
