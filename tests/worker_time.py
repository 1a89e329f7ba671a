"""Where `make test`'s wall time goes: test-seconds per xdist worker and per group, printed at the
end of the run (a pytest plugin, loaded by tests/conftest.py).

`make test` has a time budget (docs/testing.md). Its wall time is set by the busiest worker, so
cutting a test helps only if that worker runs it; this summary shows which one it is in every CI
log, without a junit file to keep.
"""

from __future__ import annotations

from collections import Counter

import pytest

_by_worker: Counter[str] = Counter()
_by_group: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the xdist controller a report carries the worker it came from (``report.node``), and its
    # nodeid ends with "@<group>" under --dist loadgroup.
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    _by_worker[worker] += report.duration
    _, at, group = report.nodeid.rpartition("@")
    _by_group[group if at else "(no group)"] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _by_worker:
        return
    terminalreporter.section("test-seconds per worker and per group")
    workers = ", ".join(f"{w} {s:,.0f}s" for w, s in sorted(_by_worker.items()))
    terminalreporter.write_line(f"workers: {workers} (total {sum(_by_worker.values()):,.0f}s)")
    for group, seconds in _by_group.most_common(12):
        terminalreporter.write_line(f"{seconds:8,.0f}s  {group}")
