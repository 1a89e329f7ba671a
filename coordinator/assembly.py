"""The coordinator's parts, built in one place in dependency order: :func:`build`.

Each part is made once every part it needs exists, and gets them by name. No part starts empty
to be filled in later: where two parts talk both ways, one of them is handed the other in a call
(the group's clients join with the rebalance handling as their listener), or reports to an
object made before both (the watchdog's reports go to :class:`WedgedCalls`, which the commit
cycle reads; an aborted partition is set aside with :class:`OwnedPartitions`, which the loop
reads). Nothing here does I/O: the parts connect when :meth:`Coordinator.run` starts them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.checks.backchecks import BackChecks
from coordinator.checks.broker_clock import BrokerClock
from coordinator.checks.checker import Checker
from coordinator.checks.registry import ProducerRegistry
from coordinator.checks.resume import ExpiryResumer
from coordinator.commit.cycle import THREAD_PREFIX, CommitCycle, KafkaCommitClients
from coordinator.commit.ownership import PartitionProducers
from coordinator.commit.payloads import HalfReader
from coordinator.config import CoordinatorConfig
from coordinator.failures import Failures
from coordinator.group.clients import GroupClients
from coordinator.group.consumer import GroupConsumers
from coordinator.group.health import Health, StableOffsets
from coordinator.group.rebalance import Rebalancer
from coordinator.group.restore import Restorer
from coordinator.monitoring.metrics import Stat, Stats
from coordinator.monitoring.watchdog import Watchdog, Wedged, WedgedCalls
from coordinator.state.owned import OwnedPartitions
from coordinator.state.scheduler import CheckPolicy
from txbridge.wire import Topics

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class Parts:
    """The coordinator's parts, each made once (:func:`build`).

    Attributes:
        config: the settings.
        topics: the namespace's topics.
        stats: the counters (:class:`coordinator.monitoring.metrics.Stat`).
        clock: the brokers' clock; every "now" compared with a broker timestamp reads it.
        policy: back-check timing and backoff.
        stopping: set when the coordinator must stop.
        failures: where a part asks for new clients or the coordinator's end.
        owned: the owned partitions: states, positions, the work of the next commits.
        running: set once partitions may be served (tests wait on it).
        health: liveness and readiness.
        state_offsets: ``<ns>_state``'s last stable offsets, for the metrics.
        wedged: where the watchdog reports stuck calls.
        watchdog: every blocking Kafka call runs under it.
        owners: one transactional producer per owned partition.
        consumers: makes the group's half/op consumers.
        clients: the group's consumer; joining and joining again.
        commit_clients: the commit cycle's Kafka side (producers, end offsets, the group's copy).
        registry: the producer registry (``<ns>_producers``).
        checker: the HTTP back-checks.
        resumer: expired transactions resumed when their group returns (None: ``resume_expired`` off).
        reader: re-reads half records by offset.
        restorer: reads where a taken-over or rewound partition stands.
        checks: which open transactions are asked about, and what an answer does.
        cycle: the commit cycle.
        rebalancer: the group's rebalance callbacks.
    """

    config: CoordinatorConfig
    topics: Topics
    stats: Stats
    clock: BrokerClock
    policy: CheckPolicy
    stopping: threading.Event
    failures: Failures
    owned: OwnedPartitions
    running: threading.Event
    health: Health
    state_offsets: StableOffsets
    wedged: WedgedCalls
    watchdog: Watchdog
    owners: PartitionProducers
    consumers: GroupConsumers
    clients: GroupClients
    commit_clients: KafkaCommitClients
    registry: ProducerRegistry
    checker: Checker
    resumer: ExpiryResumer | None
    reader: HalfReader
    restorer: Restorer
    checks: BackChecks
    cycle: CommitCycle
    rebalancer: Rebalancer


def build(
    config: CoordinatorConfig,
    transport: httpx.BaseTransport | None = None,
    *,
    on_wedged: Callable[[Wedged], None] | None = None,
    cycle_class: type[CommitCycle] = CommitCycle,
) -> Parts:
    """Make the coordinator's parts, each after the parts it needs.

    Args:
        config: the settings.
        transport: an httpx transport for back-checks (tests); None = real HTTP.
        on_wedged: called (from the watchdog's thread) when a blocking Kafka call other than a
            commit outlives its timeout; the CLI ends the process there.
        cycle_class: the commit cycle's class (a subclass may observe it: the bench).
    """
    # 1. Values and flags: what every part reads or reports to.
    topics = Topics(config.namespace)
    stats: Stats = Counter()
    clock = BrokerClock()
    policy = CheckPolicy(
        config.check_delay_s,
        config.max_checks,
        config.check_backoff_s,
        config.check_backoff_max_s,
        config.max_unasked_s,
    )
    stopping, running, failures = threading.Event(), threading.Event(), Failures()
    owned = OwnedPartitions(topics)
    health = Health(config, topics.half)
    state_offsets = StableOffsets(config, topics.state)

    # 2. Stuck calls: reported to WedgedCalls, which the commit cycle reads.
    def count_wedged() -> None:
        stats[Stat.WEDGED_CALLS] += 1

    wedged = WedgedCalls(config.instance_id, count_wedged, abandonable=THREAD_PREFIX, hook=on_wedged)
    watchdog = Watchdog(wedged.report)

    # 3. Kafka clients: the partitions' producers, the group's consumer, the commit cycle's side.
    owners = PartitionProducers(config, watchdog)
    consumers = GroupConsumers(config)
    clients = GroupClients(
        config,
        topics,
        stats=stats,
        failures=failures,
        watchdog=watchdog,
        stopping=stopping,
        make_consumer=consumers.new,
    )
    commit_clients = KafkaCommitClients(config, topics, owners, clients.consumer)

    # 4. What back-checks and restores read: the registry, the HTTP checker, the half reader.
    extra = dict(config.extra_config)
    registry = ProducerRegistry(
        config.bootstrap, topics.producers, config.producer_liveness_s, extra, clock=clock
    )
    checker = Checker(config, transport, now_s=clock.now_s)
    resumer = (
        ExpiryResumer(
            config.bootstrap,
            config.namespace,
            checker,
            owned=owned.served,
            limit=config.resume_expired_max,
            extra=config.extra_config,
        )
        if config.resume_expired
        else None
    )
    reader = HalfReader(config.bootstrap, topics.half, extra)

    # 5. The parts that work on the owned partitions.
    restorer = Restorer(config, topics, stats, watchdog, positions=owned, reader=reader, now_ms=clock.now_ms)
    checks = BackChecks(
        config,
        policy,
        stats,
        owned.states,
        batch=owned.work.batch,
        ready=owned.work.ready,
        expiring=owned.work.expiring,
        checker=checker,
        registry=registry,
        reader=reader,
        now_ms=clock.now_ms,
    )
    cycle = cycle_class(
        config,
        owned,
        stats=stats,
        failures=failures,
        watchdog=watchdog,
        kafka_side=commit_clients,
        reader=reader,
        wedged=wedged,
        rewind=owned.rewind,  # the loop rebuilds them (Coordinator._rewind)
    )
    rebalancer = Rebalancer(
        config,
        owned,
        stats=stats,
        failures=failures,
        stopping=stopping,
        cycle=cycle,
        owners=owners,
        restorer=restorer,
        health=health,
        running=running,
        end_offsets=commit_clients,
    )
    return Parts(
        config=config,
        topics=topics,
        stats=stats,
        clock=clock,
        policy=policy,
        stopping=stopping,
        failures=failures,
        owned=owned,
        running=running,
        health=health,
        state_offsets=state_offsets,
        wedged=wedged,
        watchdog=watchdog,
        owners=owners,
        consumers=consumers,
        clients=clients,
        commit_clients=commit_clients,
        registry=registry,
        checker=checker,
        resumer=resumer,
        reader=reader,
        restorer=restorer,
        checks=checks,
        cycle=cycle,
        rebalancer=rebalancer,
    )
