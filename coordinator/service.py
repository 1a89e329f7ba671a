"""The coordinator loop: consume half + op, decide, back-check, and commit in Kafka transactions.

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
stuck past its timeout replaces the clients in-process (:meth:`Coordinator._rejoin`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_any
from typing import TYPE_CHECKING, Any

from coordinator import changelog, health, membership, metrics
from coordinator.backchecks import BackChecks
from coordinator.checker import Checker
from coordinator.commit import TransactionContent
from coordinator.config import CoordinatorConfig
from coordinator.metrics import Stat, Stats
from coordinator.ownership import PartitionProducers
from coordinator.payloads import HalfReader, evict_states, record_size
from coordinator.registry import ProducerRegistry
from coordinator.republisher import Batch, quarantine_raw
from coordinator.restore import RESTORE_WAIT_S, Restorer
from coordinator.resume import ExpiryResumer
from coordinator.scheduler import CheckPolicy
from coordinator.state import PartitionState, PendingTx, Phase
from coordinator.watchdog import GRACE_S, Watchdog, Wedged
from txbridge import kafka
from txbridge.errors import KafkaOperationError, ProducerFencedError, WireFormatError
from txbridge.kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
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
#: coordinator fetches ~200 times a second; and while the loop has not yet taken what the last
#: fetch brought (QUEUED_MIN_MESSAGES or more records waiting), librdkafka fetches again only
#: after FETCH_QUEUE_BACKOFF_MS. At light load each record is fetched on arrival; under load
#: fetches come every 5 ms with whatever accumulated, as with the 5 ms / 64 KiB fetches this
#: replaces (issue 16), which made every op record at light load wait out the rest of the 5 ms.
#: Side by side on 2 cores:
#: - 20 orders/s (txbridge/tools/bench/latency_breakdown.py, 2 runs each): op append -> the loop
#:   has the op, p50 3.5-3.6 ms -> 1.0 ms; txbridge / native p50 from the local commit 3.9-4.1x
#:   -> 2.2x (``fetch.min.bytes`` 1 alone: the same);
#: - ``bench --quick --only e2e --only latency``, 3 pairs alternated, the old settings given with
#:   -X: saturated 4,009-4,664 -> 4,276-5,690 msgs/s (within the noise); p50 commit-to-visible
#:   at half that rate 31.1-35.0 -> 23.1-28.1 ms. ``fetch.min.bytes`` 1 alone cost 10-30% of the
#:   throughput (3,538-4,631 msgs/s beside 4,790-5,434; broker CPU 164-277 µs a message beside
#:   153-170).
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


#: A crashed instance's partitions move after this: the least a broker allows by default
#: (group.min.session.timeout.ms = 6000).
SESSION_TIMEOUT_MS = 6_000
#: A survivor hears of a dead member's expired session only in its next heartbeat's answer, so
#: a takeover takes (session timeout - time since the dead one's last heartbeat) + up to one
#: interval: 4-8 s at 2 s, 5.5-6.5 s at 0.5 s (the bench's failover step with the kill's
#: moment drawn at random, 2026-11-24: 4.34-5.97 s against 5.61-6.30 s in 5 pairs). The
#: members of one rebalance heartbeat in step, so the bench's old fixed kill moment saw 5 s
#: or, when the survivor's heartbeat came just before the expiry, 7 s (CHANGELOG.md).
HEARTBEAT_INTERVAL_MS = 500
#: The consumer may sit in one rebalance callback for as long (librdkafka otherwise leaves the
#: group when poll() is not called for max.poll.interval.ms, 5 minutes by default).
_MAX_POLL_INTERVAL_MS = int((RESTORE_WAIT_S + 60) * 1000)
#: An assignment whose partitions cannot be claimed or restored (a partition without a leader
#: during an election, a transaction coordinator moving) is tried again this often, this long.
_ASSIGN_RETRY_S = 0.5
_ASSIGN_RETRY_FOR_S = 60.0
#: How often the positions are copied to the group's committed offsets (for lag monitoring).
_COPY_INTERVAL_S = 1.0
#: Partition commits that end at once, on threads (librdkafka releases the GIL in its calls).
_COMMIT_THREADS = 4
#: Timeout of each call that ends a commit boundary's Kafka transaction (send_offsets, commit,
#: abort). A broker failover takes seconds; a call that times out is retried (commit) or its
#: transaction aborted and the work done again. Every such call runs under the watchdog.
TXN_CALL_TIMEOUT_S = 15.0
#: Clients that fail fatally are replaced in-process (_rejoin) at most this many times in
#: _REJOIN_WINDOW_S; more means another process uses the same instance id (its static
#: membership fences this one's over and over): the coordinator stops.
_REJOINS_MAX = 5
_REJOIN_WINDOW_S = 300.0
#: How long a commit or an abort is resumed while it fails retriably (see _end_transaction).
END_RETRY_S = 60.0


def _forget(txs: dict[str, PendingTx], gone: Callable[[PendingTx], bool]) -> None:
    """Remove the transactions ``gone`` picks, in place: the back-checks hold the same dict."""
    for tx_id in [tx_id for tx_id, tx in txs.items() if gone(tx)]:
        del txs[tx_id]


def _now_ms() -> int:
    return int(time.time() * 1000)


class Coordinator:
    """One coordinator instance. ``run()`` blocks until :meth:`stop` (or a fatal error).

    Args:
        config: the settings.
        transport: an httpx transport for back-checks (tests); None = real HTTP.
        on_wedged: called (from the watchdog's thread) when a blocking Kafka call outlives its
            timeout (see :mod:`coordinator.watchdog`); the CLI ends the process there. The
            coordinator itself only logs it: a stuck call cannot be interrupted in-process.
    """

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
        self.partitions: dict[int, PartitionState] = {}
        self._positions: dict[tuple[str, int], int] = {}
        # op partition -> its end at the previous look (see _ops_caught_up)
        self._op_ends: dict[int, int] = {}
        self._ready: set[int] = set()  # partitions where a transaction became READY since their last fill
        # partition -> its Kafka transaction being ended on a commit thread (one at a time per partition)
        self._in_flight: dict[int, Future[None]] = {}
        self._monitored: dict[int, list[TopicPartition]] = {}  # offsets to copy to the group at commit
        self._to_copy: dict[tuple[str, int], TopicPartition] = {}
        self._next_copy = 0.0
        self._next_schedule = self._next_returns = 0.0  # when _look_around looks again
        self._next_log = time.monotonic() + config.log_interval_s
        self._batch = Batch(self.topics)
        self._expiring: dict[str, PendingTx] = {}  # tx id -> a tx whose checks are exhausted
        self._incomplete: list[tuple[PendingTx, str]] = []
        self._stop = threading.Event()
        self._transport = transport
        self._consumer: Consumer | None = None
        self._registry: ProducerRegistry | None = None
        self._checker: Checker | None = None
        self._resumer: ExpiryResumer | None = None
        self._owned: frozenset[int] = frozenset()  # partitions served, for the resumer's thread
        self._reader: HalfReader | None = None
        self._checks: BackChecks | None = None  # made in _start, once its clients exist
        self._restorer: Restorer | None = None  # the same
        self._offsets: Consumer | None = None  # a never-subscribed consumer for end-offset queries
        self._metrics_server: Any = None
        self._watchdog = Watchdog(self._on_wedged)
        self._owners = PartitionProducers(config, self._watchdog)
        self._pools = 0
        self._commits = ThreadPoolExecutor(_COMMIT_THREADS, "txbridge-commit-0")
        self._unsaved: set[int] = set()  # partitions that consumed records since their last commit
        # Revoked with everything committed, producer and state kept: served on from memory if the
        # next assignment gives them back (_keep, _assign).
        self._kept: dict[int, PartitionState] = {}
        self._ending: dict[int, str] = {}  # partition -> the commit thread ending its transaction
        self._wedged_threads: set[str] = set()  # threads whose call the watchdog reported stuck
        self._fatal: KafkaOperationError | None = None  # set once the coordinator must stop
        self._clients_failed: KafkaOperationError | None = None  # _rejoin replaces the clients
        self._rejoins: list[float] = []  # monotonic times of recent rejoins
        self.running = threading.Event()  # set once partitions may be served (tests wait on it)
        self.health = health.Health(config, self.topics.half)
        self._on_wedged_hook = on_wedged

    # ------------------------------------------------------------------ lifecycle

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
            if self._fatal is not None:
                raise self._fatal
            self._drain()
            self._commit_boundary(everything=True)  # finish the open work before leaving the group
            self._drain()
            self._hand_over()
        finally:
            self._shutdown()

    def _start(self) -> None:
        cfg = self.config
        self._watchdog.start()
        extra = dict(cfg.extra_config)
        # The registry catches up in the loop: checks wait for it (BackChecks), publishing does not.
        self._registry = ProducerRegistry(
            cfg.bootstrap, self.topics.producers, cfg.producer_liveness_s, extra
        )
        self._registry.start()
        self._checker = Checker(cfg, self._transport)
        self._checker.start()
        if cfg.resume_expired:
            self._resumer = ExpiryResumer(
                cfg.bootstrap,
                cfg.namespace,
                self._checker,
                owned=lambda: set(self._owned),
                limit=cfg.resume_expired_max,
                extra=cfg.extra_config,
            )
            self._resumer.start()
        self._reader = HalfReader(cfg.bootstrap, self.topics.half, extra)
        watchdog = self._watchdog
        self._restorer = Restorer(
            cfg, self.topics, self.stats, positions=self._positions, reader=self._reader, watchdog=watchdog
        )
        self._checks = BackChecks(
            cfg,
            self.policy,
            self.stats,
            self.partitions,
            batch=self._batch,
            ready=self._ready,
            expiring=self._expiring,
            checker=self._checker,
            registry=self._registry,
            reader=self._reader,
        )
        if cfg.static_membership:
            membership.wait_for_handed_over(cfg, self.topics, self._session_timeout_s(), self._stop)
        if cfg.metrics_port is not None:
            from prometheus_client import generate_latest

            registry = metrics.make_registry(self.stats, self._gauges)
            self._metrics_server = health.serve(
                cfg.metrics_port, self.health, lambda: generate_latest(registry)
            )
        self._join()
        logger.info(
            "coordinator %s started: %r, extra_config keys %s", cfg.instance_id, cfg, sorted(cfg.extra_config)
        )

    def _join(self) -> None:
        """Create the half/op consumer and subscribe: the group assigns this instance its partitions."""
        cfg = self.config
        # Classic protocol + range keeps partition i of half and op on one member (DESIGN pitfalls).
        self._consumer = kafka.consumer(
            cfg.bootstrap,
            cfg.group_id,
            cfg.extra_config,
            partition_assignment_strategy="range",
            group_protocol="classic",
            # Failover speed: a crashed instance's partitions move after this (extra_config overrides).
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            client_id=cfg.instance_id,
            max_poll_interval_ms=_MAX_POLL_INTERVAL_MS,  # an assignment may wait out a foreign transaction
            **({"group_instance_id": cfg.instance_id} if cfg.static_membership else {}),
            **fetch_settings(),
        )
        self._consumer.subscribe(
            [self.topics.half, self.topics.op],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _rejoin(self) -> None:
        """Replace the clients after one failed, in-process, as a restart would.

        A partition's producer comes here when another owner fenced it (this coordinator was
        a zombie: its session expired while it was stopped), when it failed fatally, or when
        its commit outlived its timeout (confluentinc/librdkafka#5511: it waits forever for a
        dead group coordinator); :meth:`_on_transaction_errors`. The consumer comes here too:

        librdkafka fences its own static member when the broker acting as the group's
        coordinator dies (confluentinc/librdkafka#3437): the consumer never fetches again.
        Its partitions' uncommitted work is dropped as when partitions are lost (it is
        above the committed offsets and comes back from them), the consumer is closed, and
        a new one joins with the same instance id: the group hands it the same partitions
        at once, and :meth:`_on_assign` restores them from the committed offsets and
        ``<ns>_state``. Without this the process had to exit and start again (seconds of
        interpreter start-up on a loaded host). More than :data:`_REJOINS_MAX` failures in
        :data:`_REJOIN_WINDOW_S` stop the coordinator: that is another process using the
        same instance id, not a broker failover.
        """
        error, self._clients_failed = self._clients_failed, None
        assert error is not None
        now = time.monotonic()
        self._rejoins = [t for t in self._rejoins if now - t < _REJOIN_WINDOW_S] + [now]
        instance = self.config.instance_id
        if len(self._rejoins) > _REJOINS_MAX:
            self._fatal = KafkaOperationError(
                f"coordinator {instance} must stop: its clients failed {len(self._rejoins)} times in "
                f"{_REJOIN_WINDOW_S:.0f}s; does another coordinator of group {self.config.group_id} run "
                f"with instance id {instance}? Give each running coordinator its own --instance-id. "
                f"Last failure: {error}",
                fatal=True,
            )
            logger.error("%s", self._fatal)
            self._stop.set()
            return
        logger.warning(
            "coordinator %s: a client failed (%s); joining the group again with a new consumer and producer",
            instance,
            error,
        )
        self.stats[Stat.CONSUMER_REJOINS] += 1
        self._kept = {}
        self._drain(errors=False)
        self._batch.clear()
        self._unsaved.clear()
        self._drop(
            [
                kafka.partition_at(t, n)
                for n in list(self.partitions)
                for t in (self.topics.half, self.topics.op)
            ]
        )
        self._positions.clear()
        self.running.clear()
        old, self._consumer = self._consumer, None
        try:
            with self._watchdog.deadline("closing the failed consumer", 30):
                # nothing to commit: its partitions were dropped above
                kafka.opened(old, "the failed consumer").close()
        except Exception as exc:
            logger.info("closing the failed consumer: %s", exc)
        self._owners.release_all()  # the next assignment claims its partitions afresh
        self._renew_offsets_client()
        self._join()

    def _session_timeout_s(self) -> float:
        return float(self.config.extra_config.get("session.timeout.ms", SESSION_TIMEOUT_MS)) / 1000

    def _hand_over(self) -> None:
        """A static member's clean stop: give the partitions to the group's other members now,
        not after the session timeout (:mod:`coordinator.membership`). Its work is committed
        already; the revocation commits what was consumed since."""
        cfg = self.config
        if not cfg.static_membership or self._consumer is None or not self.partitions or self._fatal:
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
            handed.set()  # <ns>_state's partitions: never read, the consumer closes next

        self._consumer.subscribe(
            [self.topics.state], on_assign=on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        mine = {self.topics.half, self.topics.op}
        deadline = started + self._session_timeout_s() + 5.0
        while not handed.is_set() and time.monotonic() < deadline and self._consumer is not None:
            self.health.beat()
            self._collect()
            for msg in kafka.consume_available(self._client(), _BATCH, 0.05):
                if msg.error() is not None or msg.topic() in mine:
                    self._on_record(msg)  # consumed before the revocation: its commit covers them
        if handed.is_set():
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
        if self._consumer is not None:
            try:
                with self._watchdog.deadline("closing the consumer", 30):
                    self._consumer.close()  # leaves the group: partitions move at once
            except Exception:
                logger.exception("closing the consumer")
        for part in (self._resumer, self._checker, self._registry, self._reader, self._offsets):
            if part is not None:
                part.close()
        self._offsets = None
        self._owners.release_all()  # nothing is open: every transaction ended at its boundary
        self._commits.shutdown(wait=False)
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
        next_tick = time.monotonic() + interval
        while not self._stop.is_set():
            self.health.beat()
            self._collect()
            if self._clients_failed is not None:
                self._rejoin()
                continue
            if self._in_flight:  # their ends start the next commits: look again within a millisecond
                wait = 0.001
            elif self._ready:
                wait = 0.0
            else:  # librdkafka takes whole milliseconds: a poll under 1 ms returns at once
                wait = min(max(next_tick - time.monotonic(), 0.001), 0.1)
            for msg in kafka.consume_available(self._client(), _BATCH, wait):
                self._on_record(msg)
                if self._clients_failed is not None:
                    break
            if self._clients_failed is not None:
                self._rejoin()
                continue
            now = self._look_around(time.monotonic())
            if now >= next_tick:
                self._commit_boundary(everything=True)
                next_tick = time.monotonic() + interval
            elif self._ready - self._in_flight.keys():
                self._commit_boundary(everything=False)

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
            if self._resumer is not None:
                self._checks.observe_returns(self._resumer)
            self._next_returns = now + _RETURNS_INTERVAL_S
        self.health.look()  # while it owns nothing: is any partition unserved?
        if now >= self._next_log:
            self._log_counts()
            self._next_log = now + self.config.log_interval_s
        return now

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = sorted({tp.partition for tp in partitions if tp.topic == self.topics.half})
        self.health.assigning(True)
        try:
            self._assign(consumer, partitions, numbers)
        finally:
            self.health.assigning(False)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition], numbers: list[int]) -> None:
        started = time.monotonic()
        give_up = started + _ASSIGN_RETRY_FOR_S
        self._take_back(numbers)
        while True:
            try:
                self._take_over(consumer, partitions, numbers)
                break
            except (KafkaOperationError, KafkaException) as exc:
                # A partition without a leader during an election, a transaction coordinator
                # moving: tried again here, then by joining afresh; never by exiting.
                if time.monotonic() > give_up or self._stop.is_set():
                    logger.warning("taking over partitions %s failed, joining again: %s", numbers, exc)
                    self._drop(partitions)
                    self._clients_failed = kafka.to_error(exc, f"taking over partitions {numbers}")
                    return
                logger.info("taking over partitions %s: %s; trying again", numbers, exc)
                time.sleep(_ASSIGN_RETRY_S)
        pending = sum(len(self.partitions[n].pending) for n in numbers if n in self.partitions)
        logger.info("restored %d pending transactions in %.3fs", pending, time.monotonic() - started)
        logger.info("assigned partitions %s", numbers)
        self.health.serving(len(self.partitions))
        self.running.set()

    def _take_back(self, numbers: list[int]) -> None:
        """Serve on the kept partitions (:meth:`_keep`) the assignment gives back; let the others go."""
        kept, self._kept = self._kept, {}
        for number in set(kept) & set(numbers):
            self.partitions[number] = kept[number]
        # After the kept ones are back: _drop lets go of every producer of a partition not served.
        gone = sorted(set(kept) - set(numbers))
        self._drop([kafka.partition_at(t, n) for n in gone for t in (self.topics.half, self.topics.op)])
        self.stats[Stat.PARTITIONS_KEPT] += len(set(kept) & set(numbers))

    def _take_over(self, consumer: Consumer, partitions: list[TopicPartition], numbers: list[int]) -> None:
        """Claim ``numbers``, then read where they stand: the order is the ownership argument.

        Claiming first (:meth:`PartitionProducers.claim`) means that no earlier owner's
        transaction is open on them any more when their committed offsets and ``<ns>_state``
        are read, and that no earlier owner can commit after the read (docs/DESIGN.md,
        "Ownership").
        """
        fresh = [n for n in numbers if n not in self.partitions]  # not kept (_take_back)
        claimed = [n for n in fresh if n not in self._owners]
        self._owners.claim(fresh)
        self.stats[Stat.OWNERS_FENCED] += len(claimed)
        assert self._restorer is not None
        restored = self._restorer.read_changelog(fresh)
        young = self._restorer.take_positions(fresh, restored, consumer)
        # Consume from there: the group's committed offsets are only a copy for monitoring.
        consumer.assign(
            [
                kafka.partition_at(t, n, self._positions.get((t, n), kafka.OFFSET_BEGINNING))
                for n in numbers
                for t in (self.topics.half, self.topics.op)
            ]
        )
        self._install(self._restorer.restore(fresh, restored, young, consumer))
        if self.config.check_invariants:
            self._restorer.assert_settled(numbers, self._offsets_client())

    def _install(self, states: dict[int, PartitionState]) -> None:
        self.partitions.update(states)
        self._owned = frozenset(self.partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit while the partitions are still ours; the group metadata is still valid. What
        # fails to commit is above the committed offsets: the next owner does it again.
        self._drain()
        self._commit_boundary(everything=True)
        self._drain()
        self._next_copy = 0.0  # the group's copy of the offsets up to date before they go
        self._copy_to_group([])
        self._keep(partitions)
        self._drop(partitions)

    def _keep(self, partitions: list[TopicPartition]) -> None:
        """Keep the revoked partitions whose work is all committed, with their producers.

        An eager rebalance revokes every partition, and most come back to the same member in
        the next generation. No other member was assigned them in between, so nobody claimed
        their transactional ids and nothing of them was committed elsewhere: the kept state is
        current, and a claim and a restore would only read it back. Should another owner have
        claimed one all the same (a generation this member missed, two coordinators under one
        instance id), the kept producer is fenced, and its next commit fails and replaces the
        clients (:meth:`_on_transaction_errors`): nothing is committed from a stale state.
        """
        self._kept = {}
        if self._clients_failed is not None or self._fatal is not None:
            return
        batched = self._batch.partitions()
        aside = {t.partition for t in self._expiring.values()} | {t.partition for t, _ in self._incomplete}
        for number in sorted({tp.partition for tp in partitions if tp.topic == self.topics.half}):
            state = self.partitions.get(number)
            settled = number not in self._unsaved | batched | aside | self._in_flight.keys()
            if state is not None and settled and not state.unsaved_changes() and number in self._owners:
                self._kept[number] = state

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        logger.warning("partitions lost (session timeout): dropping their state without committing")
        self._drain()  # their commits fail (fenced) or land: either way above what the next owner reads
        self._batch.clear()
        self._kept = {}
        self._drop(partitions)

    def _client(self) -> Consumer:
        """The group's consumer (half + op), while the coordinator holds one."""
        return kafka.opened(self._consumer, "the coordinator's consumer")

    def _drop(self, partitions: list[Any]) -> None:
        for tp in partitions:
            if tp.partition not in self._kept:
                self._positions.pop((tp.topic, tp.partition), None)
                if tp.topic == self.topics.op:
                    self._op_ends.pop(tp.partition, None)
            if tp.topic == self.topics.half:
                self.partitions.pop(tp.partition, None)
        self._owned = frozenset(self.partitions)
        self._owners.release(self._owners.numbers() - set(self.partitions) - set(self._kept))
        self._unsaved &= set(self.partitions)
        self._ready &= set(self.partitions)
        self._to_copy = {k: tp for k, tp in self._to_copy.items() if k[1] in self.partitions}
        self._batch.clear(self._batch.partitions() - set(self.partitions))
        _forget(self._expiring, lambda t: t.partition not in self.partitions)
        self._incomplete = [(t, r) for t, r in self._incomplete if t.partition in self.partitions]

    # ------------------------------------------------------------------ input

    def _on_record(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:  # e.g. its static membership fenced
                # This consumer never fetches again: the loop replaces it (_rejoin).
                self._clients_failed = kafka.to_error(err, "consuming half and op")
            elif not kafka.is_partition_eof(err):
                logger.warning("consume: %s", err)
            return
        topic, number = msg.topic(), msg.partition()
        self._positions[(topic, number)] = msg.offset() + 1
        self._unsaved.add(number)
        state = self.partitions.get(number)
        if state is None:
            return
        if topic == self.topics.half:
            self.stats[Stat.HALF_RECORDS] += 1
            try:
                half = decode_half(msg.value(), msg.headers())
            except WireFormatError as exc:
                state.read_to(msg.offset() + 1)  # read all the same: a COMMIT may wait for this offset
                self._quarantine(msg, str(exc))
                return
            tx = state.on_half(half, msg.offset(), record_size(msg), kafka.append_time_ms(msg) or _now_ms())
            if tx is not None and tx.phase is Phase.READY:
                self._ready.add(number)
        else:
            self.stats[Stat.OP_RECORDS] += 1
            try:
                op = decode_op(msg.value())
            except WireFormatError as exc:
                self._quarantine(msg, str(exc))
                return
            tx = state.on_op(op)
            if tx is not None and tx.phase is Phase.READY:
                self._ready.add(number)

    def _quarantine(self, msg: Any, reason: str) -> None:
        origin = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        logger.warning("quarantined %s: %s", origin, reason)
        self.stats[Stat.QUARANTINED_RECORDS] += 1
        self._batch.add(
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

    # ------------------------------------------------------------------ the commit boundary

    def _with_work(self) -> list[int]:
        """The owned partitions whose next commit would change something."""
        busy = self._unsaved | self._batch.partitions()
        busy |= {t.partition for t in self._expiring.values()}
        busy |= {t.partition for t, _ in self._incomplete}
        return [n for n, s in sorted(self.partitions.items()) if n in busy or s.has_work()]

    def _commit_boundary(self, *, everything: bool) -> None:
        """Start a Kafka transaction for each partition with work whose previous one has ended.

        ``everything``: every such partition (the interval's tick); otherwise only those where a
        transaction became ready to republish. The transactions are filled here, one after
        another (producing only queues records), and ended on the commit threads; the loop
        collects them (:meth:`_collect`). What a fill moved in memory (published, set aside,
        persisted) holds once its transaction commits, and is rebuilt from Kafka if it does not.
        """
        if self._fatal is not None or not self.partitions:
            return
        busy = self._in_flight.keys()
        wanted = self._with_work() if everything else sorted(self._ready & set(self.partitions))
        numbers = [n for n in wanted if n not in busy]
        if not numbers:
            return
        self._prepare_waits(numbers)
        numbers = [n for n in (self._with_work() if everything else numbers) if n not in busy]
        expiring = [t for t in self._expiring.values() if t.phase is Phase.OPEN and t.partition in numbers]
        incomplete = [(t, r) for t, r in self._incomplete if t.partition in numbers]
        ready = {n: self.partitions[n].ready_in_order() for n in numbers}
        self._ready -= set(numbers)  # what cannot go out now waits for the tick, not a spin
        assert self._reader is not None
        try:
            self._reader.load(
                [*(t for n in numbers for t in ready[n]), *expiring, *(t for t, _ in incomplete)]
            )
        except KafkaOperationError as exc:
            logger.warning("re-reading half payloads failed, retrying at the next commit: %s", exc)
            return
        failed: dict[int, Exception] = {}
        for number in numbers:
            try:
                offsets = self._fill(
                    number,
                    ready[number],
                    [t for t in expiring if t.partition == number],
                    [(t, r) for t, r in incomplete if t.partition == number],
                )
            except Exception as exc:
                failed[number] = exc
                continue
            self._in_flight[number] = self._commits.submit(self._end, number)
            self._monitored[number] = offsets
        if failed:
            self._on_transaction_errors(failed)
        evict_states(self.partitions.values(), self.config.payload_cache_bytes)

    def _fill(
        self,
        number: int,
        ready: list[PendingTx],
        expiring: list[PendingTx],
        incomplete: list[tuple[PendingTx, str]],
    ) -> list[TopicPartition]:
        """Begin partition ``number``'s transaction and produce its records; returns the offsets
        it commits."""
        writer = self._owners.writer(number)
        self._owners.producer(number).begin_transaction()
        state = self.partitions[number]
        content = TransactionContent(writer, self.topics, state, self.stats, self.config.max_message_bytes)
        content.write(ready, expiring, incomplete, self._batch)
        half = self.topics.half
        position = self._positions.get((half, number))
        plan = content.write_changelog(position, self.config.offset_metadata_bytes)
        # From here the transaction carries it all: the partition's next fill starts afresh.
        state.mark_persisted(plan.entries, plan.tombstones, plan.young)
        self._batch.clear([number])
        _forget(self._expiring, lambda t: t.partition == number)
        self._incomplete = [(t, r) for t, r in self._incomplete if t.partition != number]
        self._unsaved.discard(number)
        # Where the partition stands goes into the same transaction, in <ns>_state: no
        # send_offsets_to_transaction (two round trips, one of them to the group coordinator,
        # and librdkafka#5511's hang when that broker dies). The claim fences earlier owners,
        # so the group's generation is not needed to fence them.
        op_position = self._positions.get((self.topics.op, number))
        where = changelog.Positions(position, op_position, plan.metadata)
        content.write_positions(where)
        return [  # a copy for monitoring (consumer lag), committed to the group once this commits
            TopicPartition(topic, number, offset)
            for topic, offset in ((half, position), (self.topics.op, op_position))
            if offset is not None
        ]

    def _end(self, number: int) -> None:
        """Commit partition ``number``'s transaction (a commit thread)."""
        self._ending[number] = threading.current_thread().name
        self._end_transaction(self._owners.producer(number), commit=True)

    def _collect(self) -> None:
        """Take the ended commits: count the committed, handle the failed (:meth:`_on_transaction_errors`).

        A commit whose call the watchdog reports stuck (confluentinc/librdkafka#5511: it waits
        forever for a dead group coordinator) cannot be interrupted: its producer is abandoned
        to its thread and the clients are replaced; the partition's next claim fences it.
        """
        failed: dict[int, Exception] = {}
        for number, future in list(self._in_flight.items()):
            if not future.done():
                if self._ending.get(number) in self._wedged_threads:
                    del self._in_flight[number]
                    failed[number] = self._abandon(number)
                continue
            del self._in_flight[number]
            error = future.exception()
            if error is None:
                self.stats[Stat.KAFKA_TRANSACTIONS] += 1
                self._copy_to_group(self._monitored.pop(number, []))
            else:
                failed[number] = error if isinstance(error, Exception) else RuntimeError(str(error))
        if failed:
            self._on_transaction_errors(failed)

    def _copy_to_group(self, offsets: list[TopicPartition]) -> None:
        """The group's committed offsets follow the positions, for lag monitoring only (the
        positions in ``<ns>_state`` are what a next owner reads): at most once a second, so
        that a commit per transaction at light load is not an offset commit per transaction."""
        self._to_copy.update({(tp.topic, tp.partition): tp for tp in offsets})
        now = time.monotonic()
        if not self._to_copy or now < self._next_copy:
            return
        self._next_copy = now + _COPY_INTERVAL_S
        copied, self._to_copy = list(self._to_copy.values()), {}
        try:
            self._client().commit(offsets=copied, asynchronous=True)
        except Exception as exc:  # a copy: the next one brings it up to date
            logger.debug("copying positions to the group: %s", exc)

    def _drain(self, *, errors: bool = True) -> None:
        """Wait for every commit in flight (before a revocation, a rejoin or the end).

        ``errors``: handle the failed ones; without, only wait (the clients are being replaced).
        """
        backstop = time.monotonic() + END_RETRY_S + 2 * TXN_CALL_TIMEOUT_S + GRACE_S
        while self._in_flight:
            done, _ = wait_for_any(list(self._in_flight.values()), timeout=0.5)
            stuck = [n for n in self._in_flight if self._ending.get(n) in self._wedged_threads]
            if not done and (stuck or time.monotonic() > backstop):
                for number in stuck or list(self._in_flight):
                    del self._in_flight[number]
                    error = self._abandon(number)
                    if errors:
                        self._on_transaction_errors({number: error})
                continue
            if errors:
                self._collect()
            else:
                for number in [n for n, f in self._in_flight.items() if f.done()]:
                    del self._in_flight[number]

    def _abandon(self, number: int) -> KafkaOperationError:
        logger.error(
            "coordinator %s: the commit of partition %d is stuck; replacing the clients",
            self.config.instance_id,
            number,
        )
        self.stats[Stat.COMMITS_WEDGED] += 1
        self._owners.abandon(number)
        self._commits.shutdown(wait=False)  # its thread stays stuck: new threads for the others
        self._pools += 1  # thread names are never reused: a stuck one stays told apart
        self._commits = ThreadPoolExecutor(_COMMIT_THREADS, f"txbridge-commit-{self._pools}")
        return KafkaOperationError(f"the commit of partition {number} is stuck", fatal=True)

    def _prepare_waits(self, numbers: list[int]) -> None:
        for state in (self.partitions[n] for n in numbers):
            if state.needs_end_offset():
                try:
                    # A client of its own: on the group consumer's connection this request would
                    # queue behind a parked fetch (fetch.wait.max.ms, 500 ms) every time.
                    with self._watchdog.deadline("reading a half partition's end offset", 10):
                        _low, high = self._offsets_client().get_watermark_offsets(
                            kafka.partition_at(self.topics.half, state.partition), timeout=10
                        )
                except Exception as exc:
                    # The waiting COMMITs wait one more interval. The client goes: after a leader
                    # moved, one that is never assigned anything kept answering UNKNOWN_PARTITION
                    # from its metadata (the nemesis saw it for minutes: the COMMITs never went out).
                    logger.warning("end offset of %s/%d: %s", self.topics.half, state.partition, exc)
                    self._renew_offsets_client()
                    continue
                state.set_end_offset(high)
            self._incomplete.extend((r.tx, r.reason) for r in state.settle_waits())

    def _renew_offsets_client(self) -> None:
        old, self._offsets = self._offsets, None
        if old is not None:
            threading.Thread(target=old.close, name="txbridge-close", daemon=True).start()

    def _offsets_client(self) -> Any:
        if self._offsets is None:
            self._offsets = kafka.consumer(
                self.config.bootstrap, f"{self.config.group_id}-offsets", self.config.extra_config
            )
        return self._offsets

    def _on_transaction_errors(self, failed: dict[int, Exception]) -> None:
        """Partitions whose transaction failed: abort and rewind them, or replace the clients."""
        rewind = []
        for number, exc in sorted(failed.items()):
            error = exc if isinstance(exc, KafkaOperationError) else kafka.to_error(exc, "committing")
            if isinstance(error, ProducerFencedError):
                # Another owner claimed the partition: this coordinator's session expired (it was
                # stopped, or cut off) and the group moved on. Its transaction is aborted already.
                logger.warning(
                    "coordinator %s: partition %d was claimed by another owner; joining again: %s",
                    self.config.instance_id,
                    number,
                    error,
                )
                self.stats[Stat.PARTITIONS_FENCED] += 1
                self._clients_failed = error
                continue
            if error.fatal:
                # The producer is unusable (e.g. librdkafka's idempotence "sequence
                # desynchronization" after a leader failover). librdkafka's remedy is a new
                # client: the next claim of the partition aborts this open transaction.
                logger.warning(
                    "coordinator %s: partition %d's producer failed fatally (%s)",
                    self.config.instance_id,
                    number,
                    error,
                )
                self.stats[Stat.PRODUCER_FATAL_ERRORS] += 1
                self._clients_failed = error
                continue
            logger.warning("partition %d: Kafka transaction aborted, rewinding it: %s", number, error)
            self.stats[Stat.KAFKA_ABORTS] += 1
            try:
                self._end_transaction(self._owners.producer(number), commit=False)
            except Exception as abort_exc:  # the producer is in no state to go on: new clients
                self._clients_failed = kafka.to_error(abort_exc, f"aborting partition {number}'s transaction")
                continue
            if error.code == KafkaError.FENCED_INSTANCE_ID:
                # The group fenced this static member (its consumer says so too, or soon will):
                # nothing to rewind on this consumer; the loop replaces it (_rejoin).
                self._clients_failed = error
                continue
            rewind.append(number)
        if rewind and self._clients_failed is None:
            try:
                self._rewind(rewind)
            except Exception as rewind_exc:  # the consumer cannot seek or read its offsets: start afresh
                self._clients_failed = kafka.to_error(rewind_exc, "rewinding to the committed offsets")

    def _end_transaction(self, producer: Producer, *, commit: bool) -> None:
        """``commit_transaction`` or ``abort_transaction``, resumed while it fails retriably.

        librdkafka's contract: a commit or an abort that failed retriably (a timeout while a
        broker fails over, in-flight messages to a dead leader) is still in progress and may be
        called again; a commit in progress may not be aborted. Resumed for up to
        :data:`END_RETRY_S`; each call runs under the watchdog.
        """
        call = producer.commit_transaction if commit else producer.abort_transaction
        what = "commit_transaction" if commit else "abort_transaction"
        give_up = time.monotonic() + END_RETRY_S
        while True:
            try:
                with self._watchdog.deadline(what, TXN_CALL_TIMEOUT_S):
                    call(TXN_CALL_TIMEOUT_S)
            except Exception as exc:
                error = kafka.to_error(exc, what)
                if (
                    not error.retriable
                    or (commit and error.txn_requires_abort)
                    or error.fatal
                    or time.monotonic() > give_up
                ):
                    raise
                logger.warning("%s; resuming it", error)
                self.stats[Stat.COMMIT_RETRIES if commit else Stat.ABORT_RETRIES] += 1
            else:
                return

    def _rewind(self, numbers: list[int]) -> None:
        """Forget the uncommitted work of ``numbers``: their state from ``<ns>_state``, the
        consumer back to their committed offsets."""
        self._batch.clear(numbers)
        _forget(self._expiring, lambda t: t.partition in numbers)
        self._incomplete = [(t, r) for t, r in self._incomplete if t.partition not in numbers]
        self._unsaved -= set(numbers)
        numbers = sorted(numbers)
        assert self._restorer is not None
        restored = self._restorer.read_changelog(numbers)
        young = self._restorer.take_positions(numbers, restored, self._client())
        for number in numbers:
            for topic in (self.topics.half, self.topics.op):
                offset = self._positions.get((topic, number), kafka.OFFSET_BEGINNING)
                self._client().seek(kafka.partition_at(topic, number, offset))
        self._install(self._restorer.restore(numbers, restored, young, self._client()))

    def _on_wedged(self, wedged: Wedged) -> None:
        self.stats[Stat.WEDGED_CALLS] += 1
        if wedged.thread.startswith("txbridge-commit"):
            # A partition's commit: the loop abandons its producer and replaces the clients (_ended).
            self._wedged_threads.add(wedged.thread)
            logger.error("coordinator %s: %s; its clients are replaced", self.config.instance_id, wedged)
            return
        logger.critical(
            "coordinator %s is stuck: %s. librdkafka cannot interrupt it; %s\n%s",
            self.config.instance_id,
            wedged,
            "ending the process so that it starts again"
            if self._on_wedged_hook is not None
            else "restart this coordinator (its partitions are not served meanwhile)",
            wedged.stack,
        )
        if self._on_wedged_hook is not None:
            self._on_wedged_hook(wedged)

    # ------------------------------------------------------------------ observability

    def _gauges(self) -> dict[str, float]:
        return {
            "pending_transactions": float(sum(len(s.pending) for s in self.partitions.values())),
            "assigned_partitions": float(len(self.partitions)),
            "unserved_partitions": float(len(self.health.unserved)),
            "ready": float(self.health.ready()),
        }

    def _log_counts(self) -> None:
        s = self.stats
        logger.info(
            "coordinator %s: partitions=%d pending=%d published=%d rolled_back=%d expired=%d "
            "quarantined=%d checks=%d conflicts=%d kafka_txns=%d aborts=%d",
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
        )
