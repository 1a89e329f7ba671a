"""The producer groups page: live instances, their check URLs, and what Kafka holds of their checks.

Pure: it takes :func:`txbridge.admin.list_producers`' instances and the transactions page's rows:
pending transactions with the number of checks each had, those no check could reach (and why),
and expired ones not resolved. The check requests' latency and failures, which live in the
coordinators' memory, are added from their metrics (:mod:`console.checks`, :func:`with_checks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from console.security import shown_url
from console.transactions import ExpiredRow, PendingRow
from txbridge.admin import Registered

if TYPE_CHECKING:
    from console.checks import GroupChecks

__all__ = ["SILENT_INTERVALS", "GroupView", "InstanceView", "groups_of", "shown_url", "with_checks"]

#: Not heard for this many of its said heartbeat intervals, an instance is silent: the
#: coordinators ask it last (the rule of coordinator/checks/registry.py, docs/wire-format.md).
SILENT_INTERVALS = 2.5


@dataclass(frozen=True)
class InstanceView:
    instance: str
    url: str
    seen_ms: int
    status: str  # live, silent (live but not heard for 2.5 intervals) or gone
    decisive: bool
    interval_s: float

    def age_s(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.seen_ms) / 1000)


@dataclass
class GroupView:
    group: str
    instances: list[InstanceView] = field(default_factory=list)
    pending: int = 0
    checks: int = 0  # back-checks the pending transactions have had
    not_asked: int = 0  # pending transactions no check could reach lately
    problem: str = ""  # the latest reason none could
    expired_unresolved: int = 0
    requests: GroupChecks | None = None  # its check requests as the coordinators count them

    @property
    def live(self) -> int:
        return sum(1 for i in self.instances if i.status != "gone")


def _status(reg: Registered, now_ms: int, liveness_s: float) -> str:
    age_ms = now_ms - reg.seen_ms
    if age_ms > liveness_s * 1000:
        return "gone"
    interval = reg.instance.interval_s
    return "silent" if interval > 0 and age_ms > SILENT_INTERVALS * interval * 1000 else "live"


def groups_of(
    registered: Iterable[Registered],
    pending: Sequence[PendingRow],
    expired: Sequence[ExpiredRow],
    now_ms: int,
    liveness_s: float,
) -> list[GroupView]:
    """Every group with a registered instance, a pending or an unresolved expired transaction."""
    groups: dict[str, GroupView] = {}

    def of(name: str) -> GroupView:
        return groups.setdefault(name, GroupView(name))

    for reg in registered:
        beat = reg.instance
        of(beat.group).instances.append(
            InstanceView(
                beat.instance,
                shown_url(beat.url),
                reg.seen_ms,
                _status(reg, now_ms, liveness_s),
                beat.decisive,
                beat.interval_s,
            )
        )
    latest_unasked: dict[str, int] = {}
    for row in pending:
        view = of(row.group)
        view.pending += 1
        view.checks += row.checks
        if row.unasked_ms is not None:
            view.not_asked += 1
            if row.unasked_ms >= latest_unasked.get(row.group, -1):
                latest_unasked[row.group] = row.unasked_ms
                view.problem = row.problem
    for e in expired:
        if e.decision is None:
            of(e.group).expired_unresolved += 1
    return sorted(groups.values(), key=lambda g: g.group)


def with_checks(groups: list[GroupView], by_group: Mapping[str, GroupChecks]) -> list[GroupView]:
    """``groups`` with their check requests' figures; a group only the coordinators know of (its
    instances gone and nothing pending) is added: its failures are what an operator looks for."""
    views = {g.group: g for g in groups}
    for name, figures in by_group.items():
        views.setdefault(name, GroupView(name)).requests = figures
    return sorted(views.values(), key=lambda g: g.group)
