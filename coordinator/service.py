"""The coordinator loop: consume half + op, decide, back-check, and commit in Kafka transactions.

The loop and the input are here; the parts it wires are modules of their own: the commit
cycle (:mod:`coordinator.commit_cycle`), the rebalance callbacks (:mod:`coordinator.rebalance`),
the clients' recovery (:mod:`coordinator.clients`), the back-checks, the restore, ownership.

At each commit boundary every owned partition with work commits a Kafka transaction
of its own, under the partition's transactional id (:mod:`coordinator.ownership`):
the republished messages of its ready committed transactions, op records of
back-check verdicts and expiries, copies to ``<ns>_expired`` / ``<ns>_quarantine``,
its ``<ns>_state`` entries, and its consumed half/op offsets (with the group
metadata). Hence the invariant: everything below a partition's committed offsets
is resolved, in ``<ns>_state``, or listed in the committed half offset.

An abortable Kafka error aborts that partition's transaction and rewinds it: its
state is rebuilt from ``<ns>_state`` and the consumer seeks back to its committed
offsets. A fenced partition (another owner claimed it), a fatal error or a commit
stuck past its timeout replaces the clients in-process (:meth:`GroupClients.rejoin`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator import health, membership, metrics
from coordinator.backchecks import BackChecks
from coordinator.broker_clock import BrokerClock
from coordinator.checker import Checker
from coordinator.clients import GroupClients
from coordinator.commit_cycle import CommitCycle, KafkaCommitClients
from coordinator.config import CoordinatorConfig
from coordinator.copartition import check_copartitioned
from coordinator.metrics import Stat, Stats
from coordinator.ownership import PartitionProducers
from coordinator.payloads import HalfReader, record_size
from coordinator.rebalance import Rebalancer
from coordinator.registry import ProducerRegistry
from coordinator.republisher import Batch, quarantine_raw
from coordinator.restore import RESTORE_WAIT_S, Restorer
from coordinator.resume import ExpiryResumer
from coordinator.scheduler import CheckPolicy
from coordinator.shared import Failures, Shared, Work
from coordinator.state import PartitionState, Phase
from coordinator.watchdog import Watchdog, Wedged
from txbridge import kafka
from txbridge.errors import TxBridgeError, WireFormatError
from txbridge.kafka import Consumer, KafkaError, KafkaException, TopicPartition
from txbridge.wire import (
    Topics,
    decode_half,
    decode_op,
)

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

_BATCH = 1000  # records per consume() call
_SCHEDULE_INTERVAL_S = 0.05  # how often due back-checks are looked for
_RETURNS_INTERVAL_S = 0.5  # how often producers that came back or went silent are looked for
#: The half/op consumer's fetches follow the load. The broker answers a fetch at the first
#: record (``fetch.min.bytes`` 1), or after FETCH_WAIT_MS when there is none, so an idle
#: coordinator fetches every FETCH_WAIT_MS; and while the loop has not yet taken what the last
#: fetch brought (QUEUED_MIN_MESSAGES or more records waiting), librdkafka fetches again only
#: after FETCH_QUEUE_BACKOFF_MS. At light load each record is fetched on arrival, so an op record
#: never waits out a fetch interval; under load fetches come every FETCH_QUEUE_BACKOFF_MS with
#: whatever accumulated, which keeps the throughput of batched fetches (``fetch.min.bytes`` 1
#: alone costs throughput; the measurements: docs/results/settings.md).
#: ``extra_config`` overrides all three.
FETCH_WAIT_MS = 5
FETCH_MIN_BYTES = 1
QUEUED_MIN_MESSAGES = 2
FETCH_QUEUE_BACKOFF_MS = 5


def fetch_settings() -> dict[str, int]:
    """The half/op consumer's fetch settings, as ``kafka.consumer`` keywords (the floor's too)."""
    return {
        "fetch_wait_max_ms": FETCH_WAIT_MS,
        "fetch_min_bytes": FETCH_MIN_BYTES,
        "queued_min_messages": QUEUED_MIN_MESSAGES,
        "fetch_queue_backoff_ms": FETCH_QUEUE_BACKOFF_MS,
    }


#: A crashed instance's partitions move after the group session timeout. On one broker it is
#: the least a broker allows by default (group.min.session.timeout.ms = 6000).
SESSION_TIMEOUT_MS = 6_000
#: On a cluster, Kafka's group coordinator (4.x) answers a heartbeat only once the writes it
#: queued before it on the group's ``__consumer_offsets`` partition are replicated, and a dead
#: follower holds them until the controller fences its node (``broker.session.timeout.ms``,
#: 9 s by default). A shorter session is lost at every node death: the members drop their
#: partitions, join again and restore, seconds after the partitions have leaders again. So on
#: more than one broker the session outlasts that window (docs/coordinator.md, "Failover").
REPLICATED_SESSION_TIMEOUT_MS = 12_000
#: A survivor hears of a dead member's expired session only in its next heartbeat's answer, so
#: a takeover takes (session timeout - time since the dead one's last heartbeat) + up to one
#: interval: with the 6 s session, 4-8 s at a 2 s interval, 5.5-6.5 s at 0.5 s. The members of
#: one rebalance heartbeat in step, so a kill at a fixed moment after a rebalance always lands
#: at the same point of their cycle (the measurements: docs/results/settings.md).
HEARTBEAT_INTERVAL_MS = 500
#: The consumer may sit in one rebalance callback for as long (librdkafka otherwise leaves the
#: group when poll() is not called for max.poll.interval.ms, 5 minutes by default).
_MAX_POLL_INTERVAL_MS = int((RESTORE_WAIT_S + 60) * 1000)


class Coordinator:
    """One coordinator instance. ``run()`` blocks until :meth:`stop` (or a fatal error).

    Args:
        config: the settings.
        transport: an httpx transport for back-checks (tests); None = real HTTP.
        on_wedged: called (from the watchdog's thread) when a blocking Kafka call outlives its
            timeout (see :mod:`coordinator.watchdog`); the CLI ends the process there. The
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
        self.config = config
        self.topics = Topics(config.namespace)
        self.policy = CheckPolicy(
            config.check_delay_s,
            config.max_checks,
            config.check_backoff_s,
            config.check_backoff_max_s,
            config.max_unasked_s,
        )
        self.stats: Stats = Counter()
        #: The brokers' clock: every comparison of "now" with a broker timestamp reads it.
        self.clock = BrokerClock()
        self.partitions: dict[int, PartitionState] = {}
        self._positions: dict[tuple[str, int], int] = {}
        # op partition -> its end at the previous look (see _ops_caught_up)
        self._op_ends: dict[int, int] = {}
        self._next_schedule = self._next_returns = 0.0  # when _look_around looks again
        self._next_log = time.monotonic() + config.log_interval_s
        self.work = Work(Batch(self.topics))  # what the next commits carry besides the states
        self._stop = threading.Event()
        self._session_ms: int | None = None  # asked of the cluster on first use, in _start
        self._transport = transport
        self._registry: ProducerRegistry | None = None
        self._checker: Checker | None = None
        self._resumer: ExpiryResumer | None = None
        self._reader: HalfReader | None = None
        self._checks: BackChecks | None = None  # made in _start, once its clients exist
        self._restorer: Restorer | None = None  # the same
        self._metrics_server: Any = None
        # late-bound: the clients, made next, need the watchdog
        self._watchdog = Watchdog(lambda wedged: self._clients.on_wedged(wedged))  # noqa: PLW0108
        self._owners = PartitionProducers(config, self._watchdog)
        self._kafka = KafkaCommitClients(config, self.topics, self._owners, self._client)
        self.failures = Failures()  # the clients to replace (rejoin), or the coordinator to stop
        # What the parts share: these same objects, changed in place by the parts.
        self._shared = Shared(
            config,
            self.topics,
            self.stats,
            self.partitions,
            self._positions,
            self.work,
            self.failures,
            self._watchdog,
            self._stop,
        )
        self._clients = GroupClients(
            self._shared,
            make_consumer=self._new_consumer,
            owners=self._owners,
            end_offsets=self._kafka,
            on_wedged=on_wedged,
        )
        self._cycle: CommitCycle | None = None  # made in _start, once the half reader exists
        self._rebalancer: Rebalancer | None = None  # made in _start, with the commit cycle
        self.running = threading.Event()  # set once partitions may be served (tests wait on it)
        self.health = health.Health(config, self.topics.half)
        self._state_offsets = health.StableOffsets(config, self.topics.state)

    # ------------------------------------------------------------------ lifecycle

    @property
    def rebalancer(self) -> Rebalancer:
        """The rebalance callbacks (:mod:`coordinator.rebalance`), once :meth:`run` started them."""
        if self._rebalancer is None:
            raise TxBridgeError("the coordinator's rebalance handling is not started")
        return self._rebalancer

    @property
    def cycle(self) -> CommitCycle:
        """The commit cycle (:mod:`coordinator.commit_cycle`), once :meth:`run` started it."""
        if self._cycle is None:
            raise TxBridgeError("the coordinator's commit cycle is not started")
        return self._cycle

    def stop(self) -> None:
        """Ask the loop to finish: commit the open work, leave the group, return from ``run()``."""
        self._stop.set()

    def run(self) -> None:
        """Run until :meth:`stop`.

        Raises:
            KafkaOperationError: the coordinator cannot go on (its clients failed again and
                again: another process with the same instance id); the caller may restart it.
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
        cfg = self.config
        check_copartitioned(cfg, self.topics)  # before anything starts: a refusal leaves nothing running
        # Before any thread or client of its own: one committer per namespace partition.
        membership.refuse_another_group(cfg, self.topics, self._session_timeout_s(), self._stop)
        self._watchdog.start()
        extra = dict(cfg.extra_config)
        # The registry catches up in the loop: checks wait for it (BackChecks), publishing does not.
        self._registry = ProducerRegistry(
            cfg.bootstrap, self.topics.producers, cfg.producer_liveness_s, extra, clock=self.clock
        )
        self._registry.start()
        self._checker = Checker(cfg, self._transport, now_s=self.clock.now_s)
        self._checker.start()
        if cfg.resume_expired:
            self._resumer = ExpiryResumer(
                cfg.bootstrap,
                cfg.namespace,
                self._checker,
                owned=lambda: set(self.rebalancer.owned),
                limit=cfg.resume_expired_max,
                extra=cfg.extra_config,
            )
            self._resumer.start()
        self._reader = HalfReader(cfg.bootstrap, self.topics.half, extra)
        self._make_parts(self._checker, self._registry, self._reader)
        # Under the consumer protocol a member that joins with another subscription than its
        # instance's previous life (handed over: <ns>_state alone) is assigned afresh at once.
        if cfg.group_protocol == "consumer":
            membership.require_consumer_protocol(cfg)
        elif cfg.static_membership:
            membership.wait_for_handed_over(cfg, self.topics, self._session_timeout_s(), self._stop)
        if cfg.metrics_port is not None:
            from prometheus_client import generate_latest

            registry = metrics.make_registry(
                self.stats,
                self._gauges,
                labelled=self._more_gauges,
                histograms=(self.cycle.visible, self._checker.latency),
                counters=(self._checker.failures,),
                info={"namespace": cfg.namespace, "group": cfg.group_id, "instance_id": cfg.instance_id},
            )
            self._metrics_server = health.serve(
                cfg.metrics_port, self.health, lambda: generate_latest(registry)
            )
        self._clients.join()
        logger.info(
            "coordinator %s started: %r, extra_config keys %s", cfg.instance_id, cfg, sorted(cfg.extra_config)
        )

    def _make_parts(self, checker: Checker, registry: ProducerRegistry, reader: HalfReader) -> None:
        """The parts that work on the owned partitions, wired to each other and to the clients."""
        cfg = self.config
        self._restorer = Restorer(self._shared, reader=reader, now_ms=self.clock.now_ms)
        self._checks = BackChecks(
            cfg,
            self.policy,
            self.stats,
            self.partitions,
            batch=self.work.batch,
            ready=self.work.ready,
            expiring=self.work.expiring,
            checker=checker,
            registry=registry,
            reader=reader,
            now_ms=self.clock.now_ms,
        )
        self._cycle = self.cycle_class(
            self._shared,
            kafka_side=self._kafka,
            reader=reader,
            # late-bound: the rebalancer, made next, needs the cycle
            rewind=lambda numbers: self.rebalancer.rewind(numbers),  # noqa: PLW0108
        )
        self._rebalancer = Rebalancer(
            self._shared,
            op_ends=self._op_ends,
            cycle=self._cycle,
            owners=self._owners,
            restorer=self._restorer,
            health=self.health,
            running=self.running,
            consumer=self._client,
            offsets_client=self._kafka.offsets_client,
        )
        self._clients.attach(self._rebalancer, self._cycle)

    def _new_consumer(self) -> Consumer:
        """The group's half/op consumer, not yet subscribed."""
        cfg = self.config
        # Partition i of half and op on one member (DESIGN pitfalls): the classic protocol with the
        # client-side range assignor, or the consumer protocol with the broker's range assignor,
        # which gives topics of equal partition counts the same numbers (and keeps them sticky).
        # Under the consumer protocol the session and the heartbeat are the group's settings,
        # the broker's (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms).
        protocol: dict[str, Any] = (
            {"group_protocol": "consumer", "group_remote_assignor": "range"}
            if cfg.group_protocol == "consumer"
            else {
                "group_protocol": "classic",
                "partition_assignment_strategy": "range",
                # Failover speed: a crashed instance's partitions move after this (extra_config overrides).
                "session_timeout_ms": self._session_timeout_ms(),
                "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            }
        )
        return kafka.consumer(
            cfg.bootstrap,
            cfg.group_id,
            cfg.extra_config,
            **protocol,
            client_id=cfg.instance_id,
            max_poll_interval_ms=_MAX_POLL_INTERVAL_MS,  # an assignment may wait out a foreign transaction
            **({"group_instance_id": cfg.instance_id} if cfg.static_membership else {}),
            **fetch_settings(),
        )

    def _session_timeout_ms(self) -> int:
        """``session.timeout.ms`` from ``extra_config``, else by the cluster's size (asked once)."""
        if self._session_ms is None:
            given = self.config.extra_config.get("session.timeout.ms")
            self._session_ms = int(given) if given is not None else self._default_session_timeout_ms()
        return self._session_ms

    def _default_session_timeout_ms(self) -> int:
        cfg = self.config
        try:
            brokers = kafka.broker_count(cfg.bootstrap, cfg.extra_config)
        except KafkaException as exc:  # no broker answered: the timeout that survives a node's death
            logger.info(
                "cluster size unknown (%s): group session timeout %d ms", exc, REPLICATED_SESSION_TIMEOUT_MS
            )
            return REPLICATED_SESSION_TIMEOUT_MS
        timeout = SESSION_TIMEOUT_MS if brokers == 1 else REPLICATED_SESSION_TIMEOUT_MS
        logger.info("%d broker(s): group session timeout %d ms", brokers, timeout)
        return timeout

    def _session_timeout_s(self) -> float:
        return self._session_timeout_ms() / 1000

    def _hand_over(self) -> None:
        """A static member's clean stop: give the partitions to the group's other members now,
        not after the session timeout (:mod:`coordinator.membership`). Its work is committed
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
        for part in (self._resumer, self._checker, self._registry, self._reader, self._kafka, self._cycle):
            if part is not None:
                part.close()
        self._owners.release_all()  # nothing is open: every transaction ended at its boundary
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.running.clear()
        self.health.stopped()
        self._watchdog.close()
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
        while not self._stop.is_set():
            self.health.beat()
            cycle.collect()
            if self.failures.clients is not None:
                self._clients.rejoin()
                continue
            if cycle.behind_in_flight():  # their ends start the next commits: look within a millisecond
                wait = 0.001
            elif cycle.waiting():
                wait = 0.0
            elif self.work.ready:  # paced (commit_pace_ms), or held for per-key order until the tick
                wait = min(max(cycle.pace_wait(), 0.001), max(next_tick - time.monotonic(), 0.001))
            else:  # librdkafka takes whole milliseconds: a poll under 1 ms returns at once
                wait = min(max(next_tick - time.monotonic(), 0.001), 0.1)
            for msg in kafka.consume_available(self._client(), _BATCH, wait):
                self.on_record(msg)
                if self.failures.clients is not None:
                    break
            if self.failures.clients is not None:
                self._clients.rejoin()
                continue
            now = self._look_around(time.monotonic())
            if now >= next_tick:
                cycle.start(everything=True)
                next_tick = time.monotonic() + interval
            elif cycle.waiting():
                cycle.start(everything=False)

    def _look_around(self, now: float) -> float:
        """Between consuming and committing: the registry, check answers and due checks,
        gone and returning producers, unserved partitions, the periodic log line."""
        assert self._registry is not None
        assert self._checks is not None
        self._registry.poll()
        self._checks.apply_results()
        if now >= self._next_schedule:  # check times are seconds apart: no need to look per record
            if self._checks.registry_read():  # else every check would find no live instance yet
                self._checks.schedule(self._ops_caught_up())
            self._next_schedule = now + _SCHEDULE_INTERVAL_S
        if now >= self._next_returns and self.partitions and self._checks.registry_read():
            self._checks.expedite_gone_writers()
            # Not while an expiry is being committed: the resumer would list <ns>_expired before
            # the expiry is in it, and ask its group only at its next return (CI saw a group
            # come back within that commit). A return is looked for again at the next look.
            if self._resumer is not None and not self.cycle.expiries_in_flight():
                self._checks.observe_returns(self._resumer)
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
        topic, number = msg.topic(), msg.partition()
        state = self.partitions.get(number)
        position = self._positions.get((topic, number), -1)
        if state is None or msg.offset() < position:
            # Fetched before a rebalance that ran inside the consume() call that returned it:
            # its partition was revoked meanwhile (and is perhaps kept, or given back), or it was
            # assigned again and this record comes once more from the positions. Its position
            # stays where the partition's state is: the record is read again from there.
            self.stats[Stat.STALE_RECORDS] += 1
            return
        self._positions[(topic, number)] = msg.offset() + 1
        self.work.unsaved.add(number)
        if topic == self.topics.half:
            self.stats[Stat.HALF_RECORDS] += 1
            try:
                half = decode_half(msg.value(), msg.headers())
            except WireFormatError as exc:
                state.read_to(msg.offset() + 1)  # read all the same: a COMMIT may wait for this offset
                self._quarantine(msg, str(exc))
                return
            tx = state.on_half(
                half, msg.offset(), record_size(msg), kafka.append_time_ms(msg) or self.clock.now_ms()
            )
            if tx is not None and tx.phase is Phase.READY:
                self.work.ready.add(number)
        else:
            self.stats[Stat.OP_RECORDS] += 1
            try:
                op = decode_op(msg.value())
            except WireFormatError as exc:
                self._quarantine(msg, str(exc))
                return
            tx = state.on_op(op)
            if tx is not None and tx.decided_ms is None:
                tx.decided_ms = kafka.append_time_ms(msg)
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
            previous = self._op_ends.get(number)
            try:  # no request: the ends (last stable offset) seen in the latest fetch response
                low, end = self._client().get_watermark_offsets(tp, cached=True)
            except Exception:
                low, end = -1, -1
            # librdkafka's position moves past control records and aborted records too.
            position = positions.get(number, -1)
            if position < 0:  # nothing read since the assignment: where the group committed, or the start
                position = self._positions.get((self.topics.op, number), low)
            if end >= 0:
                self._op_ends[number] = end
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
            *self._state_offsets.gauges(),
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
