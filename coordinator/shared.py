"""What the coordinator's parts share: :class:`Shared`, with :class:`Work` and :class:`Failures`.

The service makes one :class:`Shared` and hands it to each part (the commit cycle, the
rebalance handling, the group clients, the restorer) instead of the same long list of
arguments to each: the settings, the topics, the counters, the owned partitions' states and
positions, what the next commits carry, where failures are reported, the watchdog and the
stop flag. The dicts and sets in it are the service's own, changed in place by the parts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from coordinator.config import CoordinatorConfig
from coordinator.metrics import Stats
from coordinator.republisher import Batch
from coordinator.state import PartitionState, PendingTx
from coordinator.watchdog import Watchdog
from txbridge.errors import KafkaOperationError
from txbridge.wire import Topics


@dataclass
class Failures:
    """Why the clients must be replaced (``clients``: the loop rejoins) or the coordinator
    stop (``fatal``); shared by the parts that find out."""

    clients: KafkaOperationError | None = None
    fatal: KafkaOperationError | None = None


@dataclass
class Work:
    """What the next commits carry beyond the partitions' own states (shared with the input,
    the back-checks and the rebalance handling).

    Attributes:
        batch: op records and quarantine copies, per partition.
        ready: partitions where a transaction became READY since their last fill.
        unsaved: partitions that consumed records since their last commit.
        expiring: tx id -> a transaction whose checks are exhausted.
        incomplete: transactions whose half records cannot all be read, with why.
    """

    batch: Batch
    ready: set[int] = field(default_factory=set)
    unsaved: set[int] = field(default_factory=set)
    expiring: dict[str, PendingTx] = field(default_factory=dict)
    incomplete: list[tuple[PendingTx, str]] = field(default_factory=list)

    def busy(self) -> set[int]:
        """Partitions with something to commit besides their states' own work."""
        return (
            self.unsaved
            | self.batch.partitions()
            | {t.partition for t in self.expiring.values()}
            | {t.partition for t, _ in self.incomplete}
        )

    def forget(self, gone: Callable[[int], bool]) -> None:
        """Drop what the partitions ``gone`` picks had waiting (``ready`` stays)."""
        self.batch.clear([n for n in self.batch.partitions() if gone(n)])
        for tx_id in [tx_id for tx_id, tx in self.expiring.items() if gone(tx.partition)]:
            del self.expiring[tx_id]  # in place: the back-checks hold the same dict
        self.incomplete[:] = [(t, r) for t, r in self.incomplete if not gone(t.partition)]
        self.unsaved -= {n for n in self.unsaved if gone(n)}

    def keep_only(self, numbers: Iterable[int]) -> None:
        """Drop everything of the partitions not in ``numbers``."""
        kept = set(numbers)
        self.forget(lambda n: n not in kept)
        self.ready &= kept


@dataclass(frozen=True)
class Shared:
    """The coordinator's state that more than one part reads or changes.

    Attributes:
        config: the settings.
        topics: the namespace's topics.
        stats: the counters (:class:`coordinator.metrics.Stat`).
        partitions: the owned partitions' states (installed and dropped by the rebalance handling).
        positions: (topic, partition) -> the next offset to consume.
        work: what the next commits carry besides the states.
        failures: where a part asks for new clients or the coordinator's end.
        watchdog: every blocking Kafka call runs under it.
        stopping: set when the coordinator must stop.
    """

    config: CoordinatorConfig
    topics: Topics
    stats: Stats
    partitions: dict[int, PartitionState]
    positions: dict[tuple[str, int], int]
    work: Work
    failures: Failures
    watchdog: Watchdog
    stopping: threading.Event

    @classmethod
    def new(cls, config: CoordinatorConfig, watchdog: Watchdog) -> Shared:
        """Empty: no partition owned, nothing to commit, no failure, not stopping."""
        topics = Topics(config.namespace)
        return cls(
            config, topics, Counter(), {}, {}, Work(Batch(topics)), Failures(), watchdog, threading.Event()
        )
