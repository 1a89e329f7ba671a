"""The group's rebalance callbacks: taking partitions over, keeping them, letting them go.

The assignment callback only queues what the group gave (:class:`coordinator.group.assignments.Assignments`);
the loop takes it over right after the poll that ran the callback (:meth:`Rebalancer.take_over_queued`).
The revocation and loss callbacks do their work inside the callback: it must be done before
the partitions go to another member.

An assignment claims the partitions it gives (:class:`coordinator.commit.ownership.Ownership`:
their earlier owners fenced, claim records committed) before it reads where they stand
(:class:`coordinator.group.restore.Restorer`), and only then installs their states: the order
is the ownership argument (docs/DESIGN.md, "Ownership"). A revocation commits the open work
first; the revoked partitions whose work is all committed are kept and served on from memory
if the next assignment gives them back; those moved to another member (incremental protocol)
are released. Lost partitions are dropped without committing. A partition whose Kafka
transaction was aborted is rewound the same way a taken-over one is read, without a claim (it
is still this owner's).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from coordinator.commit import changelog
from coordinator.commit.changelog import live_owners
from coordinator.commit.cycle import CommitCycle, KafkaCommitClients
from coordinator.commit.ownership import Ownership, late_owners
from coordinator.config import CoordinatorConfig
from coordinator.failures import Failures
from coordinator.group.assignments import Assignments
from coordinator.group.health import Health
from coordinator.group.restore import Restorer
from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state.owned import OwnedPartitions
from coordinator.state.partition import PartitionState
from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import Consumer, KafkaException, TopicPartition
from txbridge.wire import POSITIONS_KEY, journal_key

logger = logging.getLogger(__name__)

#: Reads of the taken partitions' state, each after fencing the owners the one before found:
#: more than one only when other members keep claiming them meanwhile (generations in flux).
_LATE_READS = 5

#: An assignment whose partitions cannot be claimed or restored (a partition without a leader
#: during an election, a transaction coordinator moving) is tried again this often, this long.
ASSIGN_RETRY_S = 0.5
ASSIGN_RETRY_FOR_S = 60.0
#: How long a take-over's seek waits for librdkafka to start a partition just assigned
#: (:func:`txbridge.kafka.seek_started`); then the take-over is tried again (ASSIGN_RETRY_S).
SEEK_WAIT_S = 10.0


class Rebalancer:
    """Takes over, keeps and lets go of the owned partitions, as the group decides.

    Args:
        config: the coordinator's settings.
        owned: the owned partitions (installed, kept, taken back and dropped through it).
        stats: the counters.
        failures: where a failed takeover asks for new clients.
        stopping: set when the coordinator must stop (an assignment stops retrying).
        cycle: the commit cycle: a revocation commits the open work first.
        owners: the coordinator's producer and its claims (claimed and released here).
        restorer: reads where a partition stands.
        health: told while an assignment is under way and what is served.
        running: set once partitions may be served.
        end_offsets: the end-offset clients (a read_committed one for the invariant checks'
            reads; renewed with the other clients).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        owned: OwnedPartitions,
        *,
        stats: Stats,
        failures: Failures,
        stopping: threading.Event,
        cycle: CommitCycle,
        owners: Ownership,
        restorer: Restorer,
        health: Health,
        running: threading.Event,
        end_offsets: KafkaCommitClients,
    ) -> None:
        self.config = config
        self.topics = owned.topics
        self.stats = stats
        self._owned = owned
        self.partitions = owned.states
        self._positions = owned.positions
        self._work = owned.work
        self._cycle = cycle
        self._owners = owners
        self._restorer = restorer
        self._health = health
        self._running = running
        self._failures = failures
        self._stopping = stopping
        self._end_offsets = end_offsets
        # The consumer protocol (KIP-848) moves partitions incrementally: the callbacks get only
        # the moved ones, and a revoked partition goes to another member, never back in the next
        # generation, so nothing is kept.
        self._incremental = self.config.group_protocol == "consumer"
        self._assignments = Assignments(self.topics, incremental=self._incremental)

    # ------------------------------------------------------------------ assignment

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The group assigned ``partitions``: queue their take-over for the loop.

        The partitions are assigned to ``consumer`` paused (:meth:`Assignments.give`); the loop
        claims, restores and resumes them right after the poll that ran this callback returns
        (:meth:`take_over_queued`). Until then nothing of them is served: readiness waits too.
        """
        self.stats[Stat.REBALANCES] += 1
        self._health.assigning(True)
        self._assignments.give(consumer, partitions, self.partitions)

    def take_over_queued(self, consumer: Consumer) -> set[int]:
        """Take over the queued assignments (:meth:`on_assign`): the loop calls this right after
        each poll, before it applies what the poll returned. Returns the partition numbers
        taken over: a record of theirs that the poll returned was fetched before their seek,
        and is read again from their positions."""
        if not self._assignments.pending():
            return set()
        taken: set[int] = set()
        for event in self._assignments.take():
            if self._failures.clients is not None:
                break  # the clients are replaced (a take-over gave up): the next join assigns afresh
            self._assign(consumer, event.partitions, event.numbers)
            taken.update(event.numbers)
        self._health.assigning(False)
        return taken

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition], numbers: list[int]) -> None:
        started = time.monotonic()
        give_up = started + ASSIGN_RETRY_FOR_S
        self._take_back(numbers)
        while True:
            try:
                self._take_over(consumer, numbers)
                break
            except (KafkaOperationError, KafkaException, TimeoutError) as exc:
                # A partition without a leader during an election, a transaction coordinator
                # moving: tried again here, then by joining afresh; never by exiting. A partition
                # the consumer still does not know after the seek's own wait and metadata
                # refreshes is this client's view, not the cluster's: new clients at once (a
                # nemesis run saw one consumer fail so for 45 s while a new process took over).
                unknown = kafka.is_unknown_partition(exc)
                if unknown or time.monotonic() > give_up or self._stopping.is_set():
                    logger.warning("taking over partitions %s failed, joining again: %s", numbers, exc)
                    self.drop(partitions)
                    self._failures.clients = kafka.to_error(exc, f"taking over partitions {numbers}")
                    return
                logger.info("taking over partitions %s: %s; trying again", numbers, exc)
                time.sleep(ASSIGN_RETRY_S)
        pending = sum(len(self.partitions[n].pending) for n in numbers if n in self.partitions)
        logger.info("restored %d pending transactions in %.3fs", pending, time.monotonic() - started)
        logger.info("assigned partitions %s", numbers)
        self._health.serving(len(self.partitions))
        self._running.set()

    def _take_back(self, numbers: list[int]) -> None:
        """Serve on the kept partitions (:meth:`_keep`) the assignment gives back; let the others go."""
        back, gone = self._owned.take_back(numbers, check=self.config.check_invariants)
        # After the kept ones are back: drop lets go of every producer of a partition not served.
        self.drop(self._both(gone))
        self.stats[Stat.PARTITIONS_KEPT] += len(back)

    def _take_over(self, consumer: Consumer, numbers: list[int]) -> None:
        """Claim ``numbers``, then read where they stand: the order is the ownership argument.

        Claiming first (:meth:`Ownership.claim`: every unreleased claim in ``<ns>_state``
        fenced, then this owner's claim committed), and fencing after the read the owners it
        finds late (:meth:`_read_owned`), means that no earlier owner's transaction is open on
        them any more when ``<ns>_state`` is read, and that no earlier owner can commit after
        the read (docs/DESIGN.md, "Ownership").
        """
        # Kept partitions given back (_take_back) were released at the revocation: claimed again,
        # and read again unless nobody wrote to their <ns>_state in between (Ownership.reclaim).
        back = [n for n in numbers if n in self.partitions and n not in self._owners]
        fresh = [n for n in numbers if n not in self.partitions]  # not kept (_take_back)
        claimed = [n for n in fresh if n not in self._owners]
        if claimed or back:
            self._cycle.drain()  # the claim's transaction is the producer's next one
        try:
            if back:
                stale = sorted(set(back) - set(self._owners.reclaim(back)))
                if stale:
                    logger.warning(
                        "kept partitions %s were taken by another owner meanwhile: reading them again", stale
                    )
                    self._owned.drop(self._both(stale))
                    fresh = sorted({*fresh, *stale})
            self._owners.claim(fresh)
        except KafkaOperationError as exc:
            if not exc.fatal:
                raise  # tried again (_assign)
            # This producer is fenced or unusable: only new clients can claim.
            self.drop(self._both(sorted({*fresh, *back})))
            self._failures.clients = exc
            return
        self.stats[Stat.OWNERS_FENCED] += len(claimed)
        restored = self._read_owned(fresh)
        young = self._restorer.take_positions(fresh, restored, consumer)
        # Consume from there: the group's committed offsets are only a copy for monitoring.
        self._read_from_positions(consumer, numbers)
        self._install(self._restorer.restore(fresh, restored, young, consumer))
        if self.config.check_invariants:
            self._restorer.assert_settled(numbers, self._end_offsets.offsets_client())

    def _read_owned(self, fresh: list[int]) -> changelog.Restored:
        """``fresh``'s state, read once every other owner of them is fenced or released before
        this one's claim; the records of those owners deleted."""
        restored = self._restorer.read_changelog(fresh)
        # Owners the claim's read did not reach (a transaction under an id nobody claims held
        # <ns>_state's last stable offset below their claims: the restore waited it out and read
        # on), and owners released after this one's claim (they held the partition beside it):
        # fenced now, and the partitions read again, until a read finds none.
        late = self._late(fresh, restored)
        for _ in range(_LATE_READS - 1):
            if not late:
                break
            self._owners.fence(late)
            restored = self._restorer.read_changelog(fresh)
            late = self._late(fresh, restored)
        if late:
            raise KafkaOperationError(
                f"partitions {fresh} were claimed by other owners {sorted(late)} during each of "
                f"{_LATE_READS} reads of their state",
                retriable=True,
            )
        self._adopt(fresh, restored)
        return restored

    def _late(self, fresh: list[int], restored: changelog.Restored) -> dict[str, list[int]]:
        """The owners :func:`late_owners` finds in ``restored``, and their partitions."""
        late: dict[str, list[int]] = {}
        for number in fresh:
            for owner in late_owners(
                restored.owners.get(number, []),
                str(self._owners.transactional_id),
                self._owners.claimed_at(number),
                self._owners.fenced,
            ):
                late.setdefault(owner, []).append(number)
        return late

    def _adopt(self, fresh: list[int], restored: changelog.Restored) -> None:
        """Write ``fresh``'s positions to this incarnation's journal and delete the records of
        their earlier owners, all fenced or released before this one's claim."""
        # The earlier owners are fenced or released: their records and positions go, in the
        # transaction that writes their partitions' positions to this incarnation's journal.
        # Before serving, and never skipped: a next owner takes the positions of the last live
        # owner (in <ns>_state's order) that wrote any, and an earlier owner's release can lie
        # after this one's claim. A failure raises: the take-over is tried again.
        own = str(self._owners.transactional_id)
        stale: list[tuple[int, bytes]] = []
        for number in fresh:
            for read in live_owners(restored.owners.get(number, [])):
                if read.key == self._owners.key(number) or read.record is None:
                    continue
                stale.append((number, read.key))
                owner, journal = read.record.transactional_id, read.record.journal
                if journal is not None and owner != own:
                    stale.append((journal, journal_key(owner, number)))
            if number in restored.legacy:
                stale.append((number, POSITIONS_KEY))
        adopted = {n: where for n, where in restored.positions.items() if n in fresh}
        if stale or adopted:
            self._cycle.drain()  # the producer's next transaction
        self._owners.adopt(adopted, stale)

    def _read_from_positions(self, consumer: Consumer, numbers: list[int]) -> None:
        """Point the consumer at ``numbers``' positions and start reading them.

        The callback assigned them paused (:meth:`Assignments.give`): they are resumed, then
        sought. Resumed after the seek, a partition's first record came a whole second after
        the take-over, in every restart measured: librdkafka serves a paused partition's resume
        at its fetcher's next wake-up, while a seek of a partition that is fetching starts the
        fetch at once (6 ms). Whatever is fetched between the resume and the seek is discarded
        by the seek's version barrier, and no poll runs in between (this is the loop's thread).
        A partition given whose number is not served (incremental: its other topic is still on
        its way) stays paused.
        """
        positioned = self._positioned(numbers)
        if positioned:
            consumer.resume(positioned)
        kafka.seek_started(consumer, positioned, SEEK_WAIT_S)

    def rewind(self, numbers: list[int], consumer: Consumer) -> None:
        """Rebuild ``numbers`` (their Kafka transaction was aborted, :meth:`OwnedPartitions.rewind`
        set them aside) from ``<ns>_state``, and seek the consumer back to their positions."""
        restored = self._restorer.read_changelog(numbers)
        young = self._restorer.take_positions(numbers, restored, consumer)
        for tp in self._positioned(numbers):
            consumer.seek(tp)
        self._install(self._restorer.restore(numbers, restored, young, consumer))

    def _install(self, states: dict[int, PartitionState]) -> None:
        self._owned.install(states)

    # ------------------------------------------------------------------ letting go

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit while the partitions are still ours, keep what may come back, drop the rest.

        What fails to commit is above the committed positions: the next owner does it again.

        Runs inside the callback, not handed to the loop as an assignment is: once it returns the
        partitions may go to another member, whose claim may fence this one's producer (the open
        work would be done again), and a record fetched before the revocation must then find its
        partition dropped (:meth:`Coordinator.on_record` does not apply it). Their take-over,
        if still queued, is cancelled first: they were never claimed nor served.
        """
        self._cancel(partitions)
        cycle = self._cycle
        cycle.drain()
        cycle.start(everything=True)
        cycle.drain()
        cycle.copy_now()  # the group's copy of the offsets up to date before they go
        if self._incremental:
            # The partitions go to another member: a release record tells it that nothing of
            # this owner's can be open on them, so its claim fences nobody (this producer goes on
            # committing the partitions it still serves).
            revoked = {tp.partition for tp in partitions if tp.topic in (self.topics.half, self.topics.op)}
            self._release(sorted(revoked & set(self.partitions)))
            self._let_go(consumer, partitions)
            return
        # Eager: every partition is revoked, and most come back; all are released (those that
        # go to another member are then taken without a fence), and the kept ones given back are
        # claimed again (_take_over).
        revoked = {tp.partition for tp in partitions if tp.topic == self.topics.half} & self._owners.numbers()
        self._keep(partitions)
        self.drop(partitions)
        self._release(sorted(revoked))

    def _release(self, numbers: list[int]) -> None:
        """Commit release records of ``numbers`` (their last transaction ended); on failure the
        next owner fences this one instead."""
        if not numbers or self._failures.clients is not None or self._failures.fatal is not None:
            return
        try:
            self._owners.mark(numbers, released=True)
        except KafkaOperationError as exc:
            logger.warning("releasing partitions %s: %s", numbers, exc)
            if exc.fatal:
                self._failures.clients = exc

    def _let_go(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Incremental: stop reading ``partitions`` and stop serving their numbers (a number
        whose half or op partition goes is not served any more; its other one, if still
        given, is paused until the number is whole again and taken over)."""
        self._assignments.let_go(consumer, partitions)
        self.drop(self._both(sorted({tp.partition for tp in partitions})))

    def _cancel(self, partitions: list[TopicPartition]) -> None:
        """Cancel the queued take-over of ``partitions`` (revoked or lost)."""
        self._assignments.cancel(partitions)
        self._health.assigning(self._assignments.pending())

    def _keep(self, partitions: list[TopicPartition]) -> None:
        """Keep the revoked partitions whose work is all committed, in memory.

        An eager rebalance revokes every partition, and most come back to the same member in
        the next generation. They are released all the same (another member may get them), and
        claimed again when given back: :meth:`Ownership.reclaim` finds a kept state current only
        when nothing was written to the partition's ``<ns>_state`` between the release and the
        claim. Should another owner have claimed one meanwhile (a generation this member missed,
        two coordinators under one instance id), it is read again instead, and that owner
        fenced: nothing is committed from a stale state.
        """
        if self._failures.clients is not None or self._failures.fatal is not None:
            self._owned.forget_kept()
            return
        self._owned.keep(
            {tp.partition for tp in partitions if tp.topic == self.topics.half},
            busy=self._work.busy() | self._cycle.in_flight.keys(),
            producing=self._owners.__contains__,
        )

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The session expired: drop ``partitions`` without committing.

        Runs inside the callback, not handed to the loop: another member owns them already, and
        no record of theirs that the next poll returns may be applied. Their take-over, if still
        queued, is cancelled first.
        """
        self._cancel(partitions)
        logger.warning("partitions lost (session timeout): dropping their state without committing")
        self.stats[Stat.SESSIONS_LOST] += 1
        self._cycle.drain()  # their commits fail (fenced) or land: either way above what the next owner reads
        self._owned.lost()
        if self._incremental:
            self._let_go(consumer, partitions)
            return
        self.drop(partitions)

    def reset(self) -> None:
        """Let go of every partition, kept ones too, of their uncommitted work and of their
        producers: the clients are being replaced (:meth:`coordinator.group.clients.GroupClients.rejoin`);
        the next assignment claims the partitions afresh."""
        self._cycle.drain(errors=False)
        self._assignments.reset()  # the queued take-overs too: the new consumer is assigned afresh
        self._health.assigning(False)
        self._owned.reset()
        self._owners.release_all()
        self._end_offsets.renew_end_offsets()
        self._cycle.keep_copies(set())
        self._running.clear()

    def drop(self, partitions: list[Any]) -> None:
        """Stop serving ``partitions`` (:meth:`OwnedPartitions.drop`) and release the producers
        of every partition not held any more."""
        self._owned.drop(partitions)
        self._owners.release(self._owners.numbers() - self._owned.held())
        self._cycle.keep_copies(set(self.partitions))

    def _positioned(self, numbers: list[int]) -> list[TopicPartition]:
        """Half and op partitions of ``numbers`` at their positions (or their beginning)."""
        return [
            kafka.partition_at(t, n, self._positions.get((t, n), kafka.OFFSET_BEGINNING))
            for n in numbers
            for t in (self.topics.half, self.topics.op)
        ]

    def _both(self, numbers: list[int]) -> list[TopicPartition]:
        """Half and op partitions of ``numbers``."""
        return [kafka.partition_at(t, n) for n in numbers for t in (self.topics.half, self.topics.op)]
