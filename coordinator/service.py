"""The coordinator loop: consume half + op, decide, back-check, and commit in Kafka transactions.

The loop and the input are here; the parts it runs are built by :func:`coordinator.assembly.build`
and live in the sub-packages: the owned partitions' state (:mod:`coordinator.state`), the
back-checks (:mod:`coordinator.checks`), the commits (:mod:`coordinator.commit`), the group
(:mod:`coordinator.group`).

At each commit boundary the owned partitions with work commit one Kafka transaction, under
this coordinator incarnation's transactional id (:mod:`coordinator.commit.ownership`): the
republished messages of their ready committed transactions, op records of back-check
verdicts and expiries, copies to ``<ns>_expired`` / ``<ns>_quarantine``, their
``<ns>_state`` entries, and each partition's positions record. Hence the invariant:
everything below a partition's positions is resolved, in ``<ns>_state``, or listed young.

An abortable Kafka error aborts the transaction; the partitions it covered are set aside
(:meth:`OwnedPartitions.rewind`) and the loop rewinds them: their state is rebuilt from
``<ns>_state`` and the consumer seeks back to their positions. A fenced producer (another
owner took one of the partitions and fenced this id), a fatal error or a commit stuck past
its timeout replaces the
clients in-process (:meth:`GroupClients.rejoin`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from coordinator.assembly import build
from coordinator.commit.cycle import CommitCycle
from coordinator.commit.payloads import headers_size
from coordinator.config import CoordinatorConfig
from coordinator.group import health, membership
from coordinator.group.consumer import REPLICATED_SESSION_TIMEOUT_MS, SESSION_TIMEOUT_MS, fetch_settings
from coordinator.group.copartition import check_copartitioned
from coordinator.monitoring import metrics
from coordinator.monitoring.metrics import Stat
from coordinator.monitoring.watchdog import Wedged
from coordinator.state.owned import Work
from coordinator.state.partition import PartitionState, Phase
from coordinator.state.republisher import quarantine_raw
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.kafka import Consumer, KafkaError, TopicPartition
from txbridge.wire import (
    decode_half,
    decode_ops,
)

if TYPE_CHECKING:
    import httpx

#: The group consumer's settings are :mod:`coordinator.group.consumer`'s; named here too for the tools
#: and tests that read them beside the coordinator.
__all__ = ["REPLICATED_SESSION_TIMEOUT_MS", "SESSION_TIMEOUT_MS", "Coordinator", "fetch_settings"]

logger = logging.getLogger(__name__)

_BATCH = 1000  # records per consume() call
_SCHEDULE_INTERVAL_S = 0.05  # how often due back-checks are looked for
_RETURNS_INTERVAL_S = 0.5  # how often producers that came back or went silent are looked for


class Coordinator:
    """One coordinator instance. ``run()`` blocks until :meth:`stop` (or a fatal error).

    Args:
        config: the settings.
        transport: an httpx transport for back-checks (tests); None = real HTTP.
        on_wedged: called (from the watchdog's thread) when a blocking Kafka call outlives its
            timeout (see :mod:`coordinator.monitoring.watchdog`); the CLI ends the process there. The
            coordinator itself only logs it: a stuck call cannot be interrupted in-process.
    """

    #: The commit cycle's class; a subclass may observe it (the bench's latency breakdown).
    cycle_class: type[CommitCycle] = CommitCycle

    def __init__(
        self,
        config: CoordinatorConfig,
        transport: httpx.BaseTransport | None = None,
        *,
        on_wedged: Callable[[Wedged], None] | None = None,
    ) -> None:
        parts = build(config, transport, on_wedged=on_wedged, cycle_class=self.cycle_class)
        self.parts = parts
        self.config = config
        base = parts.base
        self.topics = base.topics
        self.policy = base.policy
        self.stats = base.stats
        #: The brokers' clock: every comparison of "now" with a broker timestamp reads it.
        self.clock = base.clock
        #: The owned partitions: their states, positions and the work the next commits carry.
        self.owned = base.owned
        self.failures = base.failures  # the clients to replace (rejoin), or the coordinator to stop
        self.running = base.running  # set once partitions may be served (tests wait on it)
        self.health = base.health
        self.cycle = parts.cycle
        self.rebalancer = parts.rebalancer
        self._stop = base.stopping
        self._clients = parts.kafka.clients
        self._next_schedule = self._next_returns = 0.0  # when _look_around looks again
        self._next_log = time.monotonic() + config.log_interval_s
        self._servers: list[Any] = []  # the metrics server, started by run() when there is a port

    # ------------------------------------------------------------------ lifecycle

    @property
    def partitions(self) -> Mapping[int, PartitionState]:
        """The served partitions' states (:attr:`owned`)."""
        return self.owned.states

    @property
    def work(self) -> Work:
        """What the next commits carry besides the states (:attr:`owned`)."""
        return self.owned.work

    def stop(self) -> None:
        """Ask the loop to finish: commit the open work, leave the group, return from ``run()``."""
        self._stop.set()

    def run(self) -> None:
        """Run until :meth:`stop`.

        Raises:
            KafkaOperationError: the coordinator cannot go on (its clients failed again and
                again: another process with the same instance id); the caller may restart it.
            ConfigurationError: another coordinator group serves the namespace (at the start, or
                found when this newcomer was fenced: :data:`coordinator.group.clients.NEWCOMER_S`).
        """
        self._start()
        try:
            self._loop()
            if self.failures.fatal is not None:
                raise self.failures.fatal
            cycle = self.cycle
            cycle.drain()
            cycle.start(everything=True)  # finish the open work before leaving the group
            cycle.drain()
            self._hand_over()
        finally:
            self._shutdown()

    def _start(self) -> None:
        cfg, parts = self.config, self.parts
        # The checks before joining only read the cluster, each with an admin client of its own
        # (a connection, API versions, metadata): run side by side, a restart in place waits for
        # the slowest of them, not for their sum.
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="coordinator-start")
        try:
            session = pool.submit(self._session_timeout_s)  # asked once; the waits read it
            ready_to_join = pool.submit(self._wait_ready_to_join, session.result)
            self._refuse_before_starting(pool, session.result)
            parts.base.watchdog.start()
            # The registry catches up in the loop: checks wait for it (BackChecks), publishing does not.
            parts.sources.registry.start()
            parts.sources.checker.start()
            if parts.sources.resumer is not None:
                parts.sources.resumer.start()
            ready_to_join.result()
        except BaseException:
            self._stop.set()  # a wait still running ends, and so do the threads started
            raise
        finally:
            pool.shutdown(wait=False)
        if cfg.metrics_port is not None:
            from prometheus_client import generate_latest

            registry = metrics.make_registry(
                self.stats,
                self._gauges,
                labelled=self._more_gauges,
                histograms=(self.cycle.visible, parts.sources.checker.latency),
                counters=(parts.sources.checker.failures,),
                info={"namespace": cfg.namespace, "group": cfg.group_id, "instance_id": cfg.instance_id},
            )
            self._servers.append(
                health.serve(cfg.metrics_port, self.health, lambda: generate_latest(registry))
            )
        self._clients.join(self.rebalancer)
        logger.info(
            "coordinator %s started: %r, extra_config keys %s", cfg.instance_id, cfg, sorted(cfg.extra_config)
        )

    def _refuse_before_starting(
        self, pool: ThreadPoolExecutor, session_timeout_s: Callable[[], float]
    ) -> None:
        """Refuse before any thread or client of its own starts (a refusal leaves nothing
        running): topics that are not co-partitioned, or another coordinator group serving the
        namespace (one committer per namespace partition).

        Raises:
            ConfigurationError: the co-partitioning's refusal first, else the other group's.
        """
        cfg = self.config
        copartitioned = pool.submit(check_copartitioned, cfg, self.topics)
        one_group = pool.submit(
            membership.refuse_another_group, cfg, self.topics, session_timeout_s, self._stop
        )
        copartitioned.result()
        one_group.result()

    def _wait_ready_to_join(self, session_timeout_s: Callable[[], float]) -> None:
        """Under the consumer protocol, refuse brokers that lack it; a static member of the
        classic one waits while its previous life, handed over, still holds ``<ns>_state``
        (:mod:`coordinator.group.membership`). Under the consumer protocol a member that joins
        with another subscription than its previous life's is assigned afresh at once."""
        cfg = self.config
        if cfg.group_protocol == "consumer":
            membership.require_consumer_protocol(cfg)
        elif cfg.static_membership:
            membership.wait_for_handed_over(cfg, self.topics, session_timeout_s, self._stop)

    def _session_timeout_ms(self) -> int:
        """``session.timeout.ms`` from ``extra_config``, else by the cluster's size (asked once)."""
        return self.parts.kafka.consumers.session_timeout_ms()

    def _session_timeout_s(self) -> float:
        return self.parts.kafka.consumers.session_timeout_s()

    def _hand_over(self) -> None:
        """A static member's clean stop: give the partitions to the group's other members now,
        not after the session timeout (:mod:`coordinator.group.membership`). Its work is committed
        already; the revocation commits what was consumed since."""
        cfg = self.config
        if (
            not cfg.static_membership
            or not self._clients.held()
            or not self.partitions
            or self.failures.fatal
        ):
            return
        try:
            if not membership.others_present(cfg, self.topics):
                return  # nobody to take them: a restart under this instance id gets them back at once
        except Exception as exc:
            logger.info("no hand-over: describing group %s failed: %s", cfg.group_id, exc)
            return
        numbers = sorted(self.partitions)
        started = time.monotonic()
        handed = threading.Event()

        def on_assign(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
            # <ns>_state's partitions: never read, the consumer closes next. Under the consumer
            # protocol the half and op partitions are revoked in a callback of their own.
            if not self.partitions:
                handed.set()

        self._client().subscribe(
            [self.topics.state],
            on_assign=on_assign,
            on_revoke=self.rebalancer.on_revoke,
            on_lost=self.rebalancer.on_lost,
        )
        mine = {self.topics.half, self.topics.op}
        deadline = started + self._session_timeout_s() + 5.0
        incremental = cfg.group_protocol == "consumer"

        def done() -> bool:
            return handed.is_set() or (incremental and not self.partitions)

        while not done() and time.monotonic() < deadline and self._clients.held():
            self.health.beat()
            self.cycle.collect()
            for msg in kafka.consume_available(self._client(), _BATCH, 0.05):
                if msg.error() is not None or msg.topic() in mine:
                    # Consumed before the revocation: its commit covers them. One returned after
                    # it is not applied (on_record): the next owner reads it from the positions.
                    self.on_record(msg)
        if done():
            self.stats[Stat.HANDOVERS] += 1
            logger.info(
                "coordinator %s handed partitions %s over in %.2fs",
                cfg.instance_id,
                numbers,
                time.monotonic() - started,
            )
        else:
            logger.warning(
                "coordinator %s: the hand-over of partitions %s did not complete", cfg.instance_id, numbers
            )

    def _shutdown(self) -> None:
        self._clients.close()  # leaves the group: partitions move at once
        parts = self.parts
        for part in (
            parts.sources.resumer,
            parts.sources.checker,
            parts.sources.registry,
            parts.sources.reader,
            parts.kafka.commit_clients,
            self.cycle,
        ):
            if part is not None:
                part.close()
        parts.kafka.owners.release_all()  # nothing is open: every transaction ended at its boundary
        for server in self._servers:
            server.shutdown()
        self.running.clear()
        self.health.stopped()
        parts.base.watchdog.close()
        logger.info("coordinator %s stopped: %s", self.config.instance_id, dict(self.stats))

    def _loop(self) -> None:
        """Consume, decide, check; commit by group commit.

        A partition with a transaction ready to republish starts its Kafka transaction at
        once unless its previous one is still being ended; whatever becomes ready meanwhile
        goes into the next, which starts as soon as that one ends. So a lone transaction
        waits for no timer, and under load each partition's commits batch by themselves.
        Other work (offsets, changelog entries, check verdicts) is committed every
        ``commit_interval_ms``: the interval is now only the bound on that batching.
        """
        interval = self.config.commit_interval_ms / 1000
        cycle = self.cycle
        next_tick = time.monotonic() + interval
        while not self._stop.is_set() and self.failures.fatal is None:  # run() raises a fatal one
            self.health.beat()
            cycle.collect()
            self._rewind()
            if self.failures.clients is not None:
                self._clients.rejoin(self.rebalancer)
                continue
            if cycle.behind_in_flight():  # their ends start the next commits: look within a millisecond
                wait = 0.001
            elif cycle.waiting():
                wait = 0.0
            elif self.work.ready:  # paced (commit_pace_ms), or held for per-key order until the tick
                wait = min(max(cycle.pace_wait(), 0.001), max(next_tick - time.monotonic(), 0.001))
            else:  # librdkafka takes whole milliseconds: a poll under 1 ms returns at once
                wait = min(max(next_tick - time.monotonic(), 0.001), 0.1)
            records = kafka.consume_available(self._client(), _BATCH, wait)
            # The assignments the poll's callbacks queued are taken over now, before anything it
            # returned is applied; a record of a partition taken over was fetched before its seek.
            taken = self.rebalancer.take_over_queued(self._client())
            if taken:
                records = self._fetched_before(records, taken)
            for msg in records:
                if self.failures.clients is not None:
                    break
                self.on_record(msg)
            if self.failures.clients is not None:
                self._clients.rejoin(self.rebalancer)
                continue
            now = self._look_around(time.monotonic())
            if now >= next_tick:
                cycle.start(everything=True)
                next_tick = time.monotonic() + interval
            elif cycle.waiting():
                cycle.start(everything=False)

    def _fetched_before(self, records: list[Any], taken: set[int]) -> list[Any]:
        """``records`` but those of the partitions just ``taken`` over: fetched before their seek
        (perhaps from where the group committed), they come again from the positions."""
        kept = [msg for msg in records if msg.error() is not None or msg.partition() not in taken]
        self.stats[Stat.STALE_RECORDS] += len(records) - len(kept)
        return kept

    def _rewind(self) -> None:
        """Rebuild the partitions whose Kafka transaction was aborted (the commit cycle set them
        aside: :meth:`OwnedPartitions.rewind`)."""
        numbers = self.owned.to_rewind()
        if not numbers or self.failures.clients is not None:
            return
        try:
            self.rebalancer.rewind(numbers, self._client())
        except Exception as exc:  # the consumer cannot seek or read its offsets: start afresh
            self.failures.clients = kafka.to_error(exc, "rewinding to the committed offsets")

    def _look_around(self, now: float) -> float:
        """Between consuming and committing: the registry, check answers and due checks,
        gone and returning producers, unserved partitions, the periodic log line."""
        checks = self.parts.checks
        self.parts.sources.registry.poll()
        checks.apply_results()
        if now >= self._next_schedule:  # check times are seconds apart: no need to look per record
            if checks.registry_read():  # else every check would find no live instance yet
                checks.schedule(self._ops_caught_up())
            self._next_schedule = now + _SCHEDULE_INTERVAL_S
        if now >= self._next_returns and self.partitions and checks.registry_read():
            checks.expedite_gone_writers()
            # Not while an expiry is being committed: the resumer would list <ns>_expired before
            # the expiry is in it, and ask its group only at its next return (CI saw a group
            # come back within that commit). A return is looked for again at the next look.
            resumer = self.parts.sources.resumer
            if resumer is not None and not self.cycle.expiries_in_flight():
                checks.observe_returns(resumer)
            self._next_returns = now + _RETURNS_INTERVAL_S
        self.health.look()  # while it owns nothing: is any partition unserved?
        if now >= self._next_log:
            self._log_counts()
            self._next_log = now + self.config.log_interval_s
        return now

    def _client(self) -> Consumer:
        """The group's consumer (half + op), while the coordinator holds one."""
        return self._clients.consumer()

    # ------------------------------------------------------------------ input

    def on_record(self, msg: Any) -> None:
        """Take one record the group's consumer returned (a half, an op, or a consumer error).

        The loop's only entry for input; tools observe the input here (the bench's
        latency breakdown).
        """
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:  # e.g. its static membership fenced
                # This consumer never fetches again: the loop replaces it (GroupClients.rejoin).
                self.failures.clients = kafka.to_error(err, "consuming half and op")
            elif not kafka.is_partition_eof(err):
                logger.warning("consume: %s", err)
            return
        topic, number, offset = msg.topic(), msg.partition(), msg.offset()
        state = self.partitions.get(number)
        owned = self.owned
        if state is None or offset < owned.positions.get((topic, number), -1):
            # Fetched before a rebalance that ran inside the consume() call that returned it:
            # its partition was revoked meanwhile (and is perhaps kept, or given back), or it was
            # assigned again and this record comes once more from the positions. Its position
            # stays where the partition's state is: the record is read again from there.
            self.stats[Stat.STALE_RECORDS] += 1
            return
        owned.advance(topic, number, offset + 1)
        appended = kafka.append_time_ms(msg)
        if topic == self.topics.half:
            self.stats[Stat.HALF_RECORDS] += 1
            value, headers = msg.value(), msg.headers()
            try:
                half = decode_half(value, headers)
            except WireFormatError as exc:
                state.read_to(offset + 1)  # read all the same: a COMMIT may wait for this offset
                self._quarantine(msg, str(exc))
                return
            tx = state.on_half(half, offset, headers_size(value, headers), appended or self.clock.now_ms())
            if tx is not None and tx.phase is Phase.READY:
                self.work.ready.add(number)
        else:
            self.stats[Stat.OP_RECORDS] += 1
            try:
                ops = decode_ops(msg.value())  # one decision, or a producer's batch of them
            except WireFormatError as exc:
                self._quarantine(msg, str(exc))
                return
            for op in ops:
                tx = state.on_op(op)
                if tx is not None and tx.decided_ms is None:
                    tx.decided_ms = appended
                if tx is not None and tx.phase is Phase.READY:
                    self.work.ready.add(number)

    def _quarantine(self, msg: Any, reason: str) -> None:
        origin = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        logger.warning("quarantined %s: %s", origin, reason)
        self.stats[Stat.QUARANTINED_RECORDS] += 1
        self.work.batch.add(
            msg.partition(),
            quarantine_raw(
                self.topics.quarantine,
                key=msg.key(),
                value=msg.value(),
                headers=msg.headers(),
                reason=reason,
                origin=origin,
            ),
        )

    # ------------------------------------------------------------------ back-checks

    def _consumer_positions(self, numbers: list[int]) -> dict[tuple[str, int], int] | None:
        """The consumer's positions on the owned half and op partitions (None: not known now).

        librdkafka's position moves past control records and aborted records, which no
        consumed message shows, so a half partition written by a transactional producer is
        read "to the end" only by this measure.
        """
        tps = [kafka.partition_at(t, n) for n in numbers for t in (self.topics.half, self.topics.op)]
        try:
            return {(tp.topic, tp.partition): tp.offset for tp in self._client().position(tps)}
        except Exception as exc:  # transient: checks and waits look again at the next pass
            logger.debug("partition positions: %s", exc)
            return None

    def _ops_caught_up(self) -> list[int]:
        """Owned partitions whose op partition is read past where it ended at the previous look.

        A transaction is checked only then: after a takeover or a restart the coordinator
        re-reads old halves, all past their check time, and would otherwise ask about
        transactions whose producer's decision is already in the op topic, unread.

        The same look moves each half partition's read position (see
        :meth:`PartitionState.read_to`), so a COMMIT waiting for the half partition's end
        is not left waiting behind control records.
        """
        numbers = sorted(self.partitions)
        read = self._consumer_positions(numbers)
        if read is None:
            return []
        for number in numbers:
            half_position = read.get((self.topics.half, number), -1)
            if half_position >= 0:
                self.partitions[number].read_to(half_position)
        positions = {n: read.get((self.topics.op, n), -1) for n in numbers}
        tps = [kafka.partition_at(self.topics.op, n) for n in numbers]
        ready = []
        for number, tp in zip(numbers, tps, strict=True):
            previous = self.owned.op_ends.get(number)
            try:  # no request: the ends (last stable offset) seen in the latest fetch response
                low, end = self._client().get_watermark_offsets(tp, cached=True)
            except Exception:
                low, end = -1, -1
            # librdkafka's position moves past control records and aborted records too.
            position = positions.get(number, -1)
            if position < 0:  # nothing read since the assignment: where the group committed, or the start
                position = self.owned.positions.get((self.topics.op, number), low)
            if end >= 0:
                self.owned.op_ends[number] = end
            if previous is not None and position >= previous:
                ready.append(number)
        return ready

    # ------------------------------------------------------------------ observability

    def _gauges(self) -> dict[str, float]:
        return {
            "pending_transactions": float(sum(len(s.pending) for s in self.partitions.values())),
            "assigned_partitions": float(len(self.partitions)),
            "unserved_partitions": float(len(self.health.unserved)),
            "ready": float(self.health.ready()),
            "clock_skew_seconds": self.clock.skew_ms() / 1000,
        }

    def _more_gauges(self) -> list[metrics.Gauge]:
        """The pending transactions' ages (a walk over them, at scrape time) and ``<ns>_state``'s LSOs."""

        def budget(check_after_s: float | None) -> float:
            return metrics.check_budget_s(self.policy, self.config.check_timeout_s, check_after_s)

        ages = metrics.pending_by_age(self.partitions.values(), self.clock.now_ms(), budget)
        return [
            metrics.Gauge(
                "pending_transactions_by_age",
                "pending transactions of the owned partitions by the age of their first half record",
                ages.by_band,
                "age",
            ),
            metrics.Gauge(
                "oldest_pending_age_seconds",
                "age of the oldest pending transaction of the owned partitions (0: none)",
                {"": ages.oldest_s},
            ),
            metrics.Gauge(
                "pending_past_check_budget",
                "pending transactions older than their check budget (check_budget_seconds)",
                {"": float(ages.past_budget)},
            ),
            metrics.Gauge(
                "check_budget_seconds",
                "the longest a transaction stays pending while every back-check answers UNKNOWN "
                "(check_delay_s, the backoffs between max_checks answers, their check_timeout_s)",
                {"": budget(None)},
            ),
            *self.parts.base.state_offsets.gauges(),
        ]

    def _log_counts(self) -> None:
        s = self.stats
        logger.info(
            "coordinator %s: partitions=%d pending=%d published=%d rolled_back=%d expired=%d "
            "quarantined=%d checks=%d conflicts=%d kafka_txns=%d aborts=%d clock_skew=%.3fs",
            self.config.instance_id,
            len(self.partitions),
            sum(len(p.pending) for p in self.partitions.values()),
            s[Stat.RESOLVED_PUBLISHED],
            s[Stat.RESOLVED_ROLLED_BACK],
            s[Stat.RESOLVED_EXPIRED],
            s[Stat.RESOLVED_QUARANTINED],
            s[Stat.CHECKS],
            s[Stat.CONFLICTING_OPS],
            s[Stat.KAFKA_TRANSACTIONS],
            s[Stat.KAFKA_ABORTS],
            self.clock.skew_ms() / 1000,
        )
