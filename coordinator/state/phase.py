"""The phases of a pending transaction and the transitions allowed between them.

Apart from :mod:`coordinator.state.partition` so that the parts of a partition's state
(:mod:`coordinator.state.check_queue`, :mod:`coordinator.state.key_order`) can read a transaction's
phase without importing the state that owns them.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    OPEN = "open"  # halves seen, no decision: waits for an op or a back-check
    COMMITTED = "committed"  # COMMIT decided, not every half seen yet
    READY = "ready"  # COMMIT and every half seen: republish at the next commit boundary
    PUBLISHED = "published"  # republished to the real topics
    ROLLED_BACK = "rolled_back"
    EXPIRED = "expired"  # back-checks exhausted: rolled back and copied to <ns>_expired
    QUARANTINED = "quarantined"  # committed but could not be republished
    ORPHAN = "orphan"  # a decision for halves this coordinator will never see


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPEN: frozenset(
        {Phase.COMMITTED, Phase.READY, Phase.ROLLED_BACK, Phase.EXPIRED, Phase.QUARANTINED}
    ),
    Phase.COMMITTED: frozenset({Phase.READY, Phase.QUARANTINED, Phase.ORPHAN}),
    Phase.READY: frozenset({Phase.PUBLISHED, Phase.QUARANTINED}),
    Phase.PUBLISHED: frozenset(),
    Phase.ROLLED_BACK: frozenset(),
    Phase.EXPIRED: frozenset(),
    Phase.QUARANTINED: frozenset(),
    Phase.ORPHAN: frozenset(),
}
TERMINAL = frozenset(p for p, nxt in TRANSITIONS.items() if not nxt)
UNDECIDED = frozenset({Phase.OPEN, Phase.COMMITTED})  # may still hold a later same-key tx back
DECIDED_COMMIT = frozenset({Phase.COMMITTED, Phase.READY})  # in the republish queue
