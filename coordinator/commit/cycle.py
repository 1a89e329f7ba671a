"""The commit cycle: group commit of the owned partitions' work in one Kafka transaction at a
time, ended on a thread.

A transaction ready to republish starts a Kafka transaction at once unless the previous one is
still being ended; whatever becomes ready meanwhile, on any owned partition, goes into the next,
which starts as soon as that one ends. One Kafka transaction covers every partition with work:
the coordinator has one transactional producer (:mod:`coordinator.commit.ownership`), and the
broker's cost of a transaction (its markers, one per partition written, and the transaction
coordinator's log writes) is paid once per commit, not once per partition. A transaction is
filled on the loop's thread (producing only queues records) and ended (``commit_transaction``)
on the commit thread; the loop collects it. What a fill moved in memory (published, set aside,
persisted) holds once its transaction commits, and is rebuilt from Kafka if it does not: an
abortable error aborts the transaction and every partition it covered is rewound; a fenced
producer, a fatal error or a commit stuck past its timeout asks for new clients
(:class:`Failures`).

Kafka is reached through :class:`CommitKafka` (the transactional producer and an end-offset
lookup): :class:`KafkaCommitClients` on a real broker, a fake in tests/unit.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_any
from typing import Any, Protocol

from coordinator.commit import changelog, tracing
from coordinator.commit.content import TransactionContent
from coordinator.commit.ownership import Ownership
from coordinator.commit.payloads import evict_states
from coordinator.commit.writer import TransactionWriter
from coordinator.config import CoordinatorConfig
from coordinator.failures import Failures
from coordinator.monitoring.metrics import Histogram, Stat, Stats
from coordinator.monitoring.watchdog import GRACE_S, Watchdog, WedgedCalls
from coordinator.state.owned import OwnedPartitions
from coordinator.state.partition import PendingTx, Phase
from txbridge import kafka
from txbridge.errors import KafkaOperationError, ProducerFencedError, TxBridgeError
from txbridge.kafka import Consumer, KafkaError, TopicPartition
from txbridge.wire import Topics

logger = logging.getLogger(__name__)

#: Transactions ended at once: one, the coordinator's producer has one transaction at a time
#: (librdkafka releases the GIL in its calls, so the loop gathers the next meanwhile).
COMMIT_THREADS = 1
#: Timeout of each call that ends a commit boundary's Kafka transaction (commit, abort). A
#: broker failover takes seconds; a call that times out is retried (commit) or its transaction
#: aborted and the work done again. Every such call runs under the watchdog.
TXN_CALL_TIMEOUT_S = 15.0
#: How long a commit or an abort is resumed while it fails retriably (see _end_transaction).
END_RETRY_S = 60.0
#: How often the positions are copied to the group's committed offsets (for lag monitoring).
COPY_INTERVAL_S = 1.0
#: The name of the commit threads; the watchdog's reports of a stuck call are told apart by it.
THREAD_PREFIX = "txbridge-commit"


class TransactionalProducer(Protocol):
    """The transaction calls the cycle makes on the coordinator's producer."""

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float) -> None: ...

    def abort_transaction(self, timeout: float) -> None: ...


class CommitKafka(Protocol):
    """What the commit cycle asks of Kafka."""

    def writer(self, number: int) -> TransactionWriter:
        """The producer wrapper partition ``number``'s records go to (one for every partition)."""

    def producer(self, number: int) -> TransactionalProducer:
        """The transactional producer partition ``number`` is committed with (one for every partition)."""

    def abandon(self, number: int) -> None:
        """Forget the producer without touching it (a call on it is stuck)."""

    def half_end(self, number: int, timeout: float) -> int:
        """The end offset of half partition ``number`` (raises when it cannot be read)."""

    def renew_end_offsets(self) -> None:
        """Drop the client the end offsets are read with: the next lookup makes a new one."""

    def copy_to_group(self, offsets: list[TopicPartition]) -> None:
        """Commit ``offsets`` to the group, asynchronously (a copy for lag monitoring)."""


class KafkaCommitClients:
    """:class:`CommitKafka` on a real broker: the coordinator's producer, the group's consumer and
    a never-subscribed consumer of its own for end-offset queries.

    Args:
        config: the coordinator's settings.
        topics: the namespace's topics.
        producers: the coordinator's producer and the partitions it claimed.
        consumer: the group's consumer, while the coordinator holds one.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        topics: Topics,
        producers: Ownership,
        consumer: Callable[[], Consumer],
    ) -> None:
        self._config = config
        self._topics = topics
        self._producers = producers
        self._consumer = consumer
        self._offsets: Consumer | None = None
        self._highs: Consumer | None = None

    def writer(self, number: int) -> TransactionWriter:
        return self._producers.writer(number)

    def producer(self, number: int) -> TransactionalProducer:
        return self._producers.producer(number)

    def abandon(self, number: int) -> None:
        self._producers.abandon(number)

    def half_end(self, number: int, timeout: float) -> int:
        """The half partition's high watermark. Not the last stable offset: a transaction's
        halves written in a Kafka transaction (``txbridge admin requeue``) may become readable
        after its COMMIT does, when the op partition's marker lands first, and every half
        acknowledged before the decision lies below the high watermark only."""
        _low, high = self._high_watermarks().get_watermark_offsets(
            kafka.partition_at(self._topics.half, number), timeout=timeout
        )
        return int(high)

    def _high_watermarks(self) -> Consumer:
        """A read_uncommitted client: librdkafka asks for end offsets with the client's
        isolation level, and read_committed answers the last stable offset."""
        if self._highs is None:
            self._highs = kafka.consumer(
                self._config.bootstrap,
                f"{self._config.group_id}-offsets",
                self._config.extra_config,
                isolation_level="read_uncommitted",
            )
        return self._highs

    def offsets_client(self) -> Consumer:
        """A read_committed client of its own for the ownership invariant's last stable offsets
        (on the group consumer's connection a request would queue behind a parked fetch)."""
        if self._offsets is None:
            self._offsets = kafka.consumer(
                self._config.bootstrap, f"{self._config.group_id}-offsets", self._config.extra_config
            )
        return self._offsets

    def renew_end_offsets(self) -> None:
        for old in (self._offsets, self._highs):
            if old is not None:
                threading.Thread(target=old.close, name="txbridge-close", daemon=True).start()
        self._offsets = self._highs = None

    def copy_to_group(self, offsets: list[TopicPartition]) -> None:
        self._consumer().commit(offsets=offsets, asynchronous=True)

    def close(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
        self._offsets = None


class CommitCycle:
    """Starts, ends and collects the owned partitions' Kafka transactions.

    Args:
        config: the coordinator's settings.
        owned: the owned partitions: their states, positions and the work the commits carry
            besides the states (read here; a fill takes the work it commits).
        stats: the counters.
        failures: where a fenced, fatal or stuck commit asks for new clients.
        watchdog: every blocking call runs under it.
        kafka_side: the producers and the end-offset lookups.
        reader: re-reads evicted half payloads before a fill (``load``).
        wedged: the watchdog's reports of stuck calls: a commit thread's is abandoned here.
        rewind: where partitions whose transaction was aborted are sent to be rebuilt from
            Kafka (:meth:`OwnedPartitions.rewind`, which the loop applies).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        owned: OwnedPartitions,
        *,
        stats: Stats,
        failures: Failures,
        watchdog: Watchdog,
        kafka_side: CommitKafka,
        reader: Any,
        wedged: WedgedCalls,
        rewind: Callable[[list[int]], None],
    ) -> None:
        self.config = config
        self.topics = owned.topics
        self.stats = stats
        self.partitions = owned.states
        self.positions = owned.positions
        self.work = owned.work
        self.kafka = kafka_side
        self._reader = reader
        self._watchdog = watchdog
        self.failures = failures
        self._rewind = rewind
        # partition -> the Kafka transaction covering it being ended on the commit thread (one
        # transaction at a time: every partition it covers maps to the same future)
        self.in_flight: dict[int, Future[None]] = {}
        self._monitored: dict[int, list[TopicPartition]] = {}  # offsets to copy to the group at commit
        self._decided: dict[int, list[int]] = {}  # the COMMITs' append times (ms) each commit publishes
        self.visible = Histogram(
            "commit_to_visible_seconds",
            "from a COMMIT op record's append time to the commit of the Kafka transaction republishing it",
        )
        self._with_expiries: set[int] = set()  # partitions whose last transaction filled carries expiries
        self._to_copy: dict[tuple[str, int], TopicPartition] = {}
        self._next_copy = 0.0
        self._ending: dict[int, str] = {}  # partition -> the commit thread ending its transaction
        # the commit threads whose call the watchdog reported stuck
        self._wedged = wedged
        self._pools = 0
        self._commits = ThreadPoolExecutor(COMMIT_THREADS, f"{THREAD_PREFIX}-0")
        self._pace_s = self.config.commit_pace_ms / 1000
        self._spans = tracing.spans_for(self.config.tracing)
        # partition -> when its next ready-triggered commit may start (commit_pace_ms: only
        # partitions whose last transaction republished two or more are here)
        self._paced_until: dict[int, float] = {}
        self.clock: Callable[[], float] = time.monotonic

    def expiries_in_flight(self) -> bool:
        """Whether a transaction being ended carries expiries (copies to ``<ns>_expired``).

        Their records reach ``<ns>_expired`` during the commit: a reader that takes the topic's
        end before then (the expiry resumer's listing) does not see them.
        """
        return not self._with_expiries.isdisjoint(self.in_flight)

    def waiting(self) -> set[int]:
        """Partitions with a transaction ready to republish, no commit in flight and (with
        ``commit_pace_ms``) their pace over."""
        if self.in_flight:
            return set()
        return self.work.ready - self._pacing()

    def behind_in_flight(self) -> set[int]:
        """Partitions with a transaction ready to republish behind the commit in flight.

        Only these need the loop to look again as soon as a commit ends. A commit with nothing
        behind it is collected at the loop's next turn (a record, or the interval's tick), which
        delays nothing anybody waits for; looking every millisecond for every commit in flight
        kept the loop turning through each lone transaction's whole commit, for nothing.
        """
        if not self.in_flight:
            return set()
        return self.work.ready - self._pacing()

    def _pacing(self) -> set[int]:
        """Partitions whose pace is not over yet."""
        if not self._paced_until:
            return set()
        now = self.clock()
        return {n for n, until in self._paced_until.items() if until > now}

    def pace_wait(self) -> float:
        """Seconds until a paced partition with a ready transaction may start its commit (0: none waits)."""
        paced = [self._paced_until[n] for n in self.work.ready if n in self._paced_until]
        return max(min(paced) - self.clock(), 0.0) if paced else 0.0

    def wedged(self, thread: str) -> bool:
        """Note a commit thread whose call the watchdog reported stuck; False if ``thread`` is
        not a commit thread."""
        return self._wedged.note(thread)

    def close(self) -> None:
        self._commits.shutdown(wait=False)

    # ------------------------------------------------------------------ starting commits

    def _with_work(self) -> list[int]:
        """The owned partitions whose next commit would change something."""
        busy = self.work.busy()
        return [n for n, s in sorted(self.partitions.items()) if n in busy or s.has_work()]

    def start(self, *, everything: bool) -> None:
        """Start one Kafka transaction for the partitions with work, unless one is being ended.

        ``everything``: every such partition (the interval's tick); otherwise only those where a
        transaction became ready to republish. The transaction is filled here, partition after
        partition, and ended on the commit thread; :meth:`collect` takes it.
        """
        if self.failures.fatal is not None or not self.partitions or self.in_flight:
            return
        # A paced partition skips the tick too: the tick comes every commit_interval_ms, so a pace
        # it ignored would never be longer than the interval. Its offsets and verdicts wait for
        # the pace, which is the bound on how long anything waits.
        paced = self._pacing()
        wanted = self._with_work() if everything else sorted(self.waiting() & set(self.partitions))
        numbers = [n for n in wanted if n not in paced]
        if not numbers:
            return
        self._prepare_waits(numbers)
        numbers = [n for n in (self._with_work() if everything else numbers) if n not in paced]
        if not numbers:
            return
        expiring = [
            t for t in self.work.expiring.values() if t.phase is Phase.OPEN and t.partition in numbers
        ]
        incomplete = [(t, r) for t, r in self.work.incomplete if t.partition in numbers]
        ready = {n: self.partitions[n].ready_in_order() for n in numbers}
        self.work.ready -= set(numbers)  # what cannot go out now waits for the tick, not a spin
        try:
            self._reader.load(
                [*(t for n in numbers for t in ready[n]), *expiring, *(t for t, _ in incomplete)]
            )
        except KafkaOperationError as exc:
            logger.warning("re-reading half payloads failed, retrying at the next commit: %s", exc)
            return
        filled: list[int] = []
        monitored: dict[int, list[TopicPartition]] = {}
        try:
            self.kafka.producer(numbers[0]).begin_transaction()
            for number in numbers:
                filled.append(number)  # a failure halfway leaves part of it in the transaction
                monitored[number] = self._fill(
                    number,
                    ready[number],
                    [t for t in expiring if t.partition == number],
                    [(t, r) for t, r in incomplete if t.partition == number],
                )
        except Exception as exc:
            self._on_transaction_errors(filled or numbers, exc)
            evict_states(self.partitions.values(), self.config.payload_cache_bytes)
            return
        self._with_expiries = {t.partition for t in expiring}
        for number in filled:  # until _end names its thread, no thread ends these (not a stuck one)
            self._ending.pop(number, None)
        future = self._commits.submit(self._end, filled)
        for number in filled:
            self.in_flight[number] = future
            self._monitored[number] = monitored[number]
            self._decided[number] = [t.decided_ms for t in ready[number] if t.decided_ms is not None]
            if self._pace_s and len(ready[number]) >= 2:
                self._paced_until[number] = self.clock() + self._pace_s
            else:
                self._paced_until.pop(number, None)
        evict_states(self.partitions.values(), self.config.payload_cache_bytes)

    def _fill(
        self,
        number: int,
        ready: list[PendingTx],
        expiring: list[PendingTx],
        incomplete: list[tuple[PendingTx, str]],
    ) -> list[TopicPartition]:
        """Produce partition ``number``'s records into the open transaction; returns the offsets
        it commits."""
        writer = self.kafka.writer(number)
        state = self.partitions[number]
        content = TransactionContent(
            writer, self.topics, state, self.stats, self.config.max_message_bytes, spans=self._spans
        )
        content.write(ready, expiring, incomplete, self.work.batch)
        half = self.topics.half
        position = self.positions.get((half, number))
        plan = content.write_changelog(position, self.config.offset_metadata_bytes)
        # From here the transaction carries it all: the partition's next fill starts afresh.
        state.mark_persisted(plan.entries, plan.tombstones, plan.young)
        self.work.forget(lambda n: n == number)
        # Where the partition stands goes into the same transaction, in <ns>_state: no
        # send_offsets_to_transaction (two round trips, one of them to the group coordinator,
        # and librdkafka#5511's hang when that broker dies). The claim records fence earlier
        # owners, so the group's generation is not needed to fence them.
        op_position = self.positions.get((self.topics.op, number))
        where = changelog.Positions(position, op_position, plan.metadata)
        content.write_positions(where)
        return [  # a copy for monitoring (consumer lag), committed to the group once this commits
            TopicPartition(topic, number, offset)
            for topic, offset in ((half, position), (self.topics.op, op_position))
            if offset is not None
        ]

    def _prepare_waits(self, numbers: list[int]) -> None:
        for state in (self.partitions[n] for n in numbers):
            if state.needs_end_offset():
                try:
                    with self._watchdog.deadline("reading a half partition's end offset", 10):
                        high = self.kafka.half_end(state.partition, 10)
                except Exception as exc:
                    # The waiting COMMITs wait one more interval. The client goes: after a leader
                    # moved, one that is never assigned anything kept answering UNKNOWN_PARTITION
                    # from its metadata (the nemesis saw it for minutes: the COMMITs never went out).
                    logger.warning("end offset of %s/%d: %s", self.topics.half, state.partition, exc)
                    self.kafka.renew_end_offsets()
                    continue
                state.set_end_offset(high)
            self.work.incomplete.extend((r.tx, r.reason) for r in state.settle_waits())

    # ------------------------------------------------------------------ ending them

    def _end(self, numbers: list[int]) -> None:
        """Commit the transaction covering ``numbers`` (the commit thread)."""
        name = threading.current_thread().name
        self._ending.update(dict.fromkeys(numbers, name))
        self._end_transaction(self.kafka.producer(numbers[0]), commit=True)

    def _end_transaction(self, producer: TransactionalProducer, *, commit: bool) -> None:
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

    def collect(self) -> None:
        """Take the ended commit: count it, or handle its failure (:meth:`_on_transaction_errors`).

        A commit whose call the watchdog reports stuck (confluentinc/librdkafka#5511: it waits
        forever for a dead group coordinator) cannot be interrupted: the producer is abandoned
        to its thread and the clients are replaced; the next owner of its partitions fences it.
        """
        if not self.in_flight:
            return
        numbers = sorted(self.in_flight)
        future = self.in_flight[numbers[0]]
        if not future.done():
            if self._ending.get(numbers[0]) in self._wedged:
                self.in_flight.clear()
                self._on_transaction_errors(numbers, self._abandon(numbers))
            return
        self.in_flight.clear()
        error = future.exception()
        if error is not None:
            for number in numbers:
                self._decided.pop(number, None)
            self._on_transaction_errors(
                numbers, error if isinstance(error, Exception) else RuntimeError(str(error))
            )
            return
        self.stats[Stat.KAFKA_TRANSACTIONS] += 1
        self._report_each(numbers, False)
        now_ms = time.time() * 1000
        for number in numbers:
            self._copy_to_group(self._monitored.pop(number, []))
            for ms in self._decided.pop(
                number, []
            ):  # the broker's clock against this host's: kept in step by NTP
                self.visible.observe(max(now_ms - ms, 0.0) / 1000)

    def drain(self, *, errors: bool = True) -> None:
        """Wait for the commit in flight (before a revocation, a claim, a rejoin or the end).

        ``errors``: handle a failure; without, only wait (the clients are being replaced).
        """
        backstop = time.monotonic() + END_RETRY_S + 2 * TXN_CALL_TIMEOUT_S + GRACE_S
        while self.in_flight:
            numbers = sorted(self.in_flight)
            future = self.in_flight[numbers[0]]
            done, _ = wait_for_any([future], timeout=0.5)
            stuck = self._ending.get(numbers[0]) in self._wedged
            if not done and (stuck or time.monotonic() > backstop):
                self.in_flight.clear()
                error = self._abandon(numbers)
                if errors:
                    self._on_transaction_errors(numbers, error)
                continue
            if errors:
                self.collect()
            elif future.done():
                self.in_flight.clear()

    def _abandon(self, numbers: list[int]) -> KafkaOperationError:
        logger.error(
            "coordinator %s: the commit of partitions %s is stuck; replacing the clients",
            self.config.instance_id,
            numbers,
        )
        self.stats[Stat.COMMITS_WEDGED] += 1
        self.kafka.abandon(numbers[0])
        self._commits.shutdown(wait=False)  # its thread stays stuck: a new one for the next
        self._pools += 1  # thread names are never reused: a stuck one stays told apart
        self._commits = ThreadPoolExecutor(COMMIT_THREADS, f"{THREAD_PREFIX}-{self._pools}")
        return KafkaOperationError(f"the commit of partitions {numbers} is stuck", fatal=True)

    # ------------------------------------------------------------------ failures

    def _on_transaction_errors(self, numbers: list[int], exc: BaseException) -> None:
        """The transaction covering ``numbers`` failed: abort it and rewind every partition it
        covered, or replace the clients."""
        error = exc if isinstance(exc, KafkaOperationError) else kafka.to_error(exc, "committing")  # type: ignore[arg-type]
        if self._needs_new_clients(numbers, error):
            self.failures.clients = error
            return
        logger.warning("partitions %s: Kafka transaction aborted, rewinding them: %s", numbers, error)
        self.stats[Stat.KAFKA_ABORTS] += 1
        # A record the broker refused fails the commit, and only its delivery report says which:
        # the retry reports each record (and the fault poisons its transaction).
        self._report_each(numbers, True)
        try:
            self._end_transaction(self.kafka.producer(numbers[0]), commit=False)
        except Exception as abort_exc:  # the producer is in no state to go on: new clients
            self.failures.clients = kafka.to_error(
                abort_exc, f"aborting the transaction of partitions {numbers}"
            )
            return
        if error.code == KafkaError.FENCED_INSTANCE_ID:
            # The group fenced this static member (its consumer says so too, or soon will):
            # nothing to rewind on this consumer; the loop replaces it (rejoin).
            self.failures.clients = error
            return
        # Rebuilt by the loop: the partitions are set aside at once, so that nothing more is
        # applied to or committed from what the aborted transaction left in memory.
        self._rewind(sorted(numbers))

    def _report_each(self, numbers: list[int], on: bool) -> None:
        """Turn the writer's per-record delivery reports on or off (:attr:`TransactionWriter.report_each`)."""
        # No producer (being replaced): the next one starts with them off.
        with contextlib.suppress(TxBridgeError):
            self.kafka.writer(numbers[0]).report_each = on

    def _needs_new_clients(self, numbers: list[int], error: KafkaOperationError) -> bool:
        """A fenced producer or a fatal error: the transaction is not aborted, the clients go."""
        if isinstance(error, ProducerFencedError):
            # Another owner fenced this coordinator's id: its session expired (it was stopped,
            # or cut off) and the group moved one of its partitions on. Its transaction is
            # aborted already.
            logger.warning(
                "coordinator %s: another owner fenced its id (partitions %s); joining again: %s",
                self.config.instance_id,
                numbers,
                error,
            )
            self.stats[Stat.PARTITIONS_FENCED] += 1
            return True
        if error.fatal:
            # The producer is unusable (e.g. librdkafka's idempotence "sequence
            # desynchronization" after a leader failover). librdkafka's remedy is a new
            # client: the next owner of the partitions fences this open transaction.
            logger.warning(
                "coordinator %s: its producer failed fatally (%s)",
                self.config.instance_id,
                error,
            )
            self.stats[Stat.PRODUCER_FATAL_ERRORS] += 1
            return True
        return False

    # ------------------------------------------------------------------ the group's copy

    def _copy_to_group(self, offsets: list[TopicPartition]) -> None:
        """The group's committed offsets follow the positions, for lag monitoring only (the
        positions in ``<ns>_state`` are what a next owner reads): at most once a second, so
        that a commit per transaction at light load is not an offset commit per transaction."""
        self._to_copy.update({(tp.topic, tp.partition): tp for tp in offsets})
        now = time.monotonic()
        if not self._to_copy or now < self._next_copy:
            return
        self._next_copy = now + COPY_INTERVAL_S
        copied, self._to_copy = list(self._to_copy.values()), {}
        try:
            self.kafka.copy_to_group(copied)
        except Exception as exc:  # a copy: the next one brings it up to date
            logger.debug("copying positions to the group: %s", exc)

    def copy_now(self) -> None:
        """Bring the group's copy of the offsets up to date now (before the partitions go)."""
        self._next_copy = 0.0
        self._copy_to_group([])

    def keep_copies(self, numbers: set[int]) -> None:
        """Forget the copies of partitions not in ``numbers``."""
        self._to_copy = {k: tp for k, tp in self._to_copy.items() if k[1] in numbers}
