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
from coordinator.commit.ownership import Ownership
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
class Foundation:
    """What every part reads or reports to (step 1 of :func:`build`).

    Attributes:
        config: the settings.
        topics: the namespace's topics.
        stats: the counters (:class:`coordinator.monitoring.metrics.Stat`).
        clock: the brokers' clock; every "now" compared with a broker timestamp reads it.
        policy: back-check timing and backoff.
        stopping: set when the coordinator must stop.
        running: set once partitions may be served (tests wait on it).
        failures: where a part asks for new clients or the coordinator's end.
        owned: the owned partitions: states, positions, the work of the next commits.
        health: liveness and readiness.
        state_offsets: ``<ns>_state``'s last stable offsets, for the metrics.
        wedged: where the watchdog reports stuck calls.
        watchdog: every blocking Kafka call runs under it.
    """

    config: CoordinatorConfig
    topics: Topics
    stats: Stats
    clock: BrokerClock
    policy: CheckPolicy
    stopping: threading.Event
    running: threading.Event
    failures: Failures
    owned: OwnedPartitions
    health: Health
    state_offsets: StableOffsets
    wedged: WedgedCalls
    watchdog: Watchdog


@dataclass(frozen=True)
class KafkaSide:
    """The Kafka clients the parts share (step 2 of :func:`build`).

    Attributes:
        owners: the coordinator's transactional producer and the partitions it claimed.
        consumers: makes the group's half/op consumers.
        clients: the group's consumer; joining and joining again.
        commit_clients: the commit cycle's Kafka side (producers, end offsets, the group's copy).
    """

    owners: Ownership
    consumers: GroupConsumers
    clients: GroupClients
    commit_clients: KafkaCommitClients


@dataclass(frozen=True)
class Sources:
    """What back-checks and restores read (step 3 of :func:`build`).

    Attributes:
        registry: the producer registry (``<ns>_producers``).
        checker: the HTTP back-checks.
        resumer: expired transactions resumed when their group returns (None: ``resume_expired`` off).
        reader: re-reads half records by offset.
    """

    registry: ProducerRegistry
    checker: Checker
    resumer: ExpiryResumer | None
    reader: HalfReader


@dataclass(frozen=True)
class Parts:
    """The coordinator's parts, each made once (:func:`build`).

    Attributes:
        base: what every part reads or reports to.
        kafka: the shared Kafka clients.
        sources: what back-checks and restores read.
        restorer: reads where a taken-over or rewound partition stands.
        checks: which open transactions are asked about, and what an answer does.
        cycle: the commit cycle.
        rebalancer: the group's rebalance callbacks.
    """

    base: Foundation
    kafka: KafkaSide
    sources: Sources
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
    base = foundation(config, on_wedged)  # 1
    kafka = kafka_side(base)  # 2
    sources = check_sources(base, transport)  # 3
    # 4. The parts that work on the owned partitions.
    owned, stats, failures, watchdog = base.owned, base.stats, base.failures, base.watchdog
    restorer = Restorer(
        config, base.topics, stats, watchdog, positions=owned, reader=sources.reader, now_ms=base.clock.now_ms
    )
    checks = BackChecks(
        config,
        base.policy,
        stats,
        owned.states,
        batch=owned.work.batch,
        ready=owned.work.ready,
        expiring=owned.work.expiring,
        checker=sources.checker,
        registry=sources.registry,
        reader=sources.reader,
        now_ms=base.clock.now_ms,
    )
    cycle = cycle_class(
        config,
        owned,
        stats=stats,
        failures=failures,
        watchdog=watchdog,
        kafka_side=kafka.commit_clients,
        reader=sources.reader,
        wedged=base.wedged,
        rewind=owned.rewind,  # the loop rebuilds them (Coordinator._rewind)
    )
    rebalancer = Rebalancer(
        config,
        owned,
        stats=stats,
        failures=failures,
        stopping=base.stopping,
        cycle=cycle,
        owners=kafka.owners,
        restorer=restorer,
        health=base.health,
        running=base.running,
        end_offsets=kafka.commit_clients,
    )
    return Parts(base, kafka, sources, restorer, checks, cycle, rebalancer)


def foundation(config: CoordinatorConfig, on_wedged: Callable[[Wedged], None] | None) -> Foundation:
    """Values and flags, the owned partitions, health, and the watchdog with where it reports."""
    topics = Topics(config.namespace)
    stats: Stats = Counter()
    policy = CheckPolicy(
        config.check_delay_s,
        config.max_checks,
        config.check_backoff_s,
        config.check_backoff_max_s,
        config.max_unasked_s,
    )

    def count_wedged() -> None:
        stats[Stat.WEDGED_CALLS] += 1

    # Stuck calls are reported to WedgedCalls, made first: the commit cycle reads it later.
    wedged = WedgedCalls(config.instance_id, count_wedged, abandonable=THREAD_PREFIX, hook=on_wedged)
    return Foundation(
        config=config,
        topics=topics,
        stats=stats,
        clock=BrokerClock(),
        policy=policy,
        stopping=threading.Event(),
        running=threading.Event(),
        failures=Failures(),
        owned=OwnedPartitions(topics),
        health=Health(config, topics.half),
        state_offsets=StableOffsets(config, topics.state),
        wedged=wedged,
        watchdog=Watchdog(wedged.report),
    )


def kafka_side(base: Foundation) -> KafkaSide:
    """The coordinator's producer and its claims, the group's consumer, the commit cycle's Kafka side."""
    config = base.config
    owners = Ownership(config, base.watchdog)
    consumers = GroupConsumers(config)
    clients = GroupClients(
        config,
        base.topics,
        stats=base.stats,
        failures=base.failures,
        watchdog=base.watchdog,
        stopping=base.stopping,
        make_consumer=consumers.new,
    )
    commit_clients = KafkaCommitClients(config, base.topics, owners, clients.consumer)
    return KafkaSide(owners, consumers, clients, commit_clients)


def check_sources(base: Foundation, transport: httpx.BaseTransport | None) -> Sources:
    """The registry, the HTTP checker, the expiry resumer and the half reader."""
    config = base.config
    extra = dict(config.extra_config)
    checker = Checker(config, transport, now_s=base.clock.now_s)
    resumer = (
        ExpiryResumer(
            config.bootstrap,
            config.namespace,
            checker,
            owned=base.owned.served,
            limit=config.resume_expired_max,
            extra=config.extra_config,
        )
        if config.resume_expired
        else None
    )
    return Sources(
        registry=ProducerRegistry(
            config.bootstrap, base.topics.producers, config.producer_liveness_s, extra, clock=base.clock
        ),
        checker=checker,
        resumer=resumer,
        reader=HalfReader(config.bootstrap, base.topics.half, extra),
    )
