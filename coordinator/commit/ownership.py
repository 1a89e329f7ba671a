"""Who commits a partition's work: one transactional producer per coordinator incarnation, and
the claim and release records that name it in ``<ns>_state``.

Each incarnation of a coordinator (each time its clients are built) commits under a
transactional id of its own, never used before or after
(:func:`txbridge.wire.coordinator_transactional_id`), one Kafka transaction per commit covering
every owned partition. Before it serves partition ``p`` it commits a claim record naming that
id into ``<ns>_state`` ``p`` (:meth:`Ownership.claim`), under a key of that claim's own
(:func:`txbridge.wire.owner_key`); a partition it lets go to another member gets a release
record under the same key in its last transaction (:meth:`Ownership.mark`). A new owner fences
the id of every claim it reads that is not released (``init_transactions`` on it: Kafka aborts
that id's open transaction and bumps its epoch, so the earlier owner, dead or a zombie that will
wake up, can never commit again), and after its restore also every owner released after its
own claim (:func:`late_owners`); then, in one transaction, it writes the partitions'
positions to its journal (one ``<ns>_state`` partition for all it owns) and deletes the records
of the owners it has dealt with (:meth:`Ownership.adopt`). A partition with no record at all
was served by an older txbridge under the partition's own id, which is fenced the same way. The
argument is in docs/DESIGN.md, "Ownership".
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from typing import Any

from coordinator.commit import changelog
from coordinator.commit.changelog import OwnerRead, live_owners
from coordinator.commit.writer import TransactionWriter
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.watchdog import Watchdog
from txbridge import kafka
from txbridge.errors import KafkaOperationError, TxBridgeError
from txbridge.kafka import Producer
from txbridge.wire import (
    OwnerRecord,
    Positions,
    Topics,
    coordinator_transactional_id,
    journal_key,
    journal_partition,
    owner_key,
)

logger = logging.getLogger(__name__)

#: Earlier owners fenced at once: each fence is a few round trips to the transaction coordinator
#: (and more when its transaction must be aborted first: _FENCE_ASK_AGAIN_S), so a coordinator
#: that takes twelve partitions from as many dead owners waits for about one of them, not twelve.
_FENCE_THREADS = 8
_INIT_TIMEOUT_S = 30.0
#: librdkafka asks again for a producer id answered CONCURRENT_TRANSACTIONS (the id's open
#: transaction is being aborted) only after a fixed 500 ms (rd_kafka_idemp_pid_timer_restart in
#: rdkafka_idempotence.c), where the abort ends within tens of milliseconds. So a fence not
#: answered this soon asks a second time, from a second client on the same id: the first answer
#: fences the id (an answer means its transaction is over and its epoch bumped).
_FENCE_ASK_AGAIN_S = 0.15
#: Timeout of the calls that end a claim's or a release's transaction.
_MARK_TIMEOUT_S = 15.0


def to_fence(live: list[OwnerRead], own: str) -> set[str]:
    """Before a claim: the ids of the live claims among ``live`` (a partition's owner records,
    :func:`changelog.read_owners`) that are not released, other than ``own``."""
    return set(changelog.claimants(live)) - {own}


def late_owners(reads: list[OwnerRead], own: str, claimed_at: int, fenced: set[str]) -> set[str]:
    """After the claim committed at offset ``claimed_at``: the ids in ``reads`` (a partition's
    owner records, as the restore read them) still to fence.

    Each other owner whose live record is a claim not released (one the read before the claim
    did not reach), and each whose live record lies after this owner's claim, a release
    included: that owner held the partition beside this one (a generation one of them missed),
    and a partition it keeps is served on from memory when nothing lies between its release and
    its next claim (:meth:`Ownership.reclaim`), a check that cannot see a claim committed
    before the release. Fenced, it can never commit the partition again.
    """
    late = set()
    for read in live_owners(reads):
        assert read.record is not None  # live_owners keeps no tombstone
        owner = read.record.transactional_id
        if owner != own and owner not in fenced and (not read.record.released or read.offset > claimed_at):
            late.add(owner)
    return late


def _discard(clients: list[Any]) -> None:
    """Drop the last references to released producers here, so that their destruction waits here."""
    for client in clients:
        try:
            client.flush(0)
        except Exception as exc:  # a fenced or fatal producer has nothing worth delivering
            logger.debug("flushing a released producer: %s", exc)
    clients.clear()


class Ownership:
    """This coordinator's transactional producer and the partitions it claimed with it.

    Args:
        config: the coordinator's settings (bootstrap, client settings, transaction timeout).
        watchdog: reports an ``init_transactions`` or a claim that outlives its timeout.
    """

    def __init__(self, config: CoordinatorConfig, watchdog: Watchdog) -> None:
        self.config = config
        self._state_topic = Topics(config.namespace).state
        self._watchdog = watchdog
        self._writer: TransactionWriter | None = None
        self._claimed: set[int] = set()
        self._sizes: dict[str, tuple[int | None, float]] = {}  # partition-count cache
        #: This incarnation's transactional id (None until its producer is made).
        self.transactional_id: str | None = None
        #: The earlier owners' ids fenced so far.
        self.fenced: set[str] = set()
        #: The ``<ns>_state`` partition this incarnation writes its positions to (its journal).
        self.journal = 0
        #: Partition -> the offset of this producer's last release record in its ``<ns>_state``.
        self._released_at: dict[int, int] = {}
        #: Partition -> the owner key of this producer's last claim of it, and that claim's offset.
        self._keys: dict[int, bytes] = {}
        self._claimed_at: dict[int, int] = {}
        self._claims = itertools.count(1)

    def __contains__(self, number: object) -> bool:
        return number in self._claimed

    def numbers(self) -> set[int]:
        """The partitions claimed."""
        return set(self._claimed)

    def claimed_at(self, number: int) -> int:
        """The offset in ``<ns>_state`` of this producer's claim of ``number``."""
        return self._claimed_at[number]

    def key(self, number: int) -> bytes | None:
        """The owner key of this producer's last claim of ``number`` (None: never claimed)."""
        return self._keys.get(number)

    def writer(self, number: int | None = None) -> TransactionWriter:
        """The producer's wrapper: every owned partition's records go there."""
        if self._writer is None:
            raise TxBridgeError("the coordinator's producer is not open")
        return self._writer

    def producer(self, number: int | None = None) -> Producer:
        return kafka.opened(self.writer().producer, "the coordinator's producer")

    # ------------------------------------------------------------------ claiming

    def claim(self, numbers: Iterable[int]) -> None:
        """Fence the earlier owners of ``numbers`` and commit this owner's claim records: from
        here on nobody else commits them.

        Raises:
            KafkaOperationError: the owner records could not be read, an earlier owner fenced,
                or the claim committed (none of ``numbers`` is claimed then).
        """
        wanted = sorted(set(numbers) - self._claimed)
        if not wanted:
            return
        # A new incarnation's producer is initialised while the owners are read and fenced: its id
        # is new, so no owner record names it and nothing here waits for it.
        cfg = self.config
        own = self.transactional_id or coordinator_transactional_id(cfg.namespace, cfg.instance_id)
        with ThreadPoolExecutor(1, "txbridge-init") as pool:
            made = pool.submit(self._ensure_producer, own)
            try:
                owners = self._read_owners(wanted)
                earlier: dict[str, list[int]] = {}
                for number in wanted:
                    live = owners.get(number)
                    # None: an older txbridge's data, or nobody's yet
                    ids = to_fence(live, own) if live else {cfg.partition_transactional_id(number)}
                    for transactional_id in ids:
                        earlier.setdefault(transactional_id, []).append(number)
                self.fence(earlier)
            finally:
                made.result()
        self.mark(wanted, released=False)

    def _read_owners(self, numbers: list[int]) -> dict[int, list[OwnerRead]]:
        with self._watchdog.deadline(f"reading the owners of {self._state_topic}", 2 * _INIT_TIMEOUT_S):
            return changelog.read_owners(
                self.config.bootstrap, self._state_topic, numbers, self.config.extra_config, _INIT_TIMEOUT_S
            )

    def fence(self, earlier: dict[str, list[int]]) -> None:
        """``init_transactions`` on each of ``earlier``'s ids (id -> the partitions it held):
        whatever it left open is aborted, and it can never commit again.

        Raises:
            KafkaOperationError: an id could not be fenced.
        """
        ids = sorted(set(earlier) - self.fenced)  # a fenced id stays fenced: it is never used again
        if not ids:
            return
        with ThreadPoolExecutor(min(_FENCE_THREADS, len(ids)), "txbridge-fence") as pool:
            outcomes = list(pool.map(self._fence_one, ids))
        for transactional_id, outcome in zip(ids, outcomes, strict=True):
            if outcome is not None:
                raise kafka.to_error(
                    outcome,
                    f"fencing {transactional_id}, the owner of partitions {earlier[transactional_id]}",
                )
            self.fenced.add(transactional_id)
        logger.info("fenced the earlier owners %s", earlier)

    def _fence_one(self, transactional_id: str) -> Exception | None:
        """Fence one id (:data:`_FENCE_ASK_AGAIN_S`): None once a client under it is answered,
        else the error of the last to fail. A slower ask left running ends by itself."""
        asks = ThreadPoolExecutor(2, "txbridge-fence-ask")
        try:
            futures = [asks.submit(self._ask, transactional_id)]
            if not wait(futures, timeout=_FENCE_ASK_AGAIN_S).done:
                futures.append(asks.submit(self._ask, transactional_id))
            outcome: Exception | None = None
            for future in as_completed(futures):  # in the order they end
                outcome = future.result()
                if outcome is None:
                    return None
            return outcome
        finally:
            asks.shutdown(wait=False)

    def _ask(self, transactional_id: str) -> Exception | None:
        try:
            producer = self._initialised(transactional_id)
        except Exception as exc:
            return exc.__cause__ if isinstance(exc.__cause__, Exception) else exc  # the client's own error
        self._release_clients([producer])
        return None

    def _initialised(self, transactional_id: str, **settings: Any) -> Producer:
        """A producer under ``transactional_id``, ``init_transactions`` done: whatever that id
        left open is aborted and its epoch bumped. Released again if the init fails.

        Raises:
            KafkaOperationError: the init failed.
        """
        cfg = self.config
        producer = kafka.producer(
            cfg.bootstrap,
            cfg.extra_config,
            transactional_id=transactional_id,
            transaction_timeout_ms=cfg.transaction_timeout_ms,
            **settings,
        )
        try:
            with self._watchdog.deadline(f"init_transactions of {transactional_id}", 2 * _INIT_TIMEOUT_S):
                kafka.init_transactions(producer, _INIT_TIMEOUT_S)
        except Exception as exc:
            self._release_clients([producer])
            raise kafka.to_error(exc, f"initialising the transactional id {transactional_id}") from exc
        return producer

    def reclaim(self, numbers: Iterable[int]) -> list[int]:
        """Claim again partitions this producer released and kept (an eager rebalance gave them
        back); returns those whose kept state is still current.

        A kept partition is current when nothing was written to its ``<ns>_state`` between this
        producer's release and this claim: the claim lies right after the release's commit
        marker. Anything in between (another owner's claim, whatever it then committed) makes
        it stale: the caller reads it again, and the restore fences that other owner. An owner
        that claimed before the release is no more current than this one: its restore finds
        this release after its claim and fences this producer (:func:`late_owners`). Checked
        after the claim is committed, so an owner claiming later finds this claim and fences
        this producer. The released claim's record is deleted in the same transaction.

        Raises:
            KafkaOperationError: the claim failed.
        """
        wanted = sorted(set(numbers) - self._claimed)
        released_at = {n: self._released_at.pop(n) for n in wanted if n in self._released_at}
        offsets = self.mark(wanted, released=False)
        # The release record, then its transaction's commit marker, then the claim.
        return [n for n in wanted if n in released_at and offsets.get(n) == released_at[n] + 2]

    def mark(self, numbers: Iterable[int], *, released: bool) -> dict[int, int]:
        """Commit an owner record for each of ``numbers`` in one transaction: a claim (under a
        new key; the record of this producer's earlier claim of the partition, released, is
        deleted), or a release of this producer's claim (the partitions may go to another
        member, whose claim then fences nobody). Released partitions are no longer claimed,
        claimed ones are. Returns each claim's or release's offset.

        The commit cycle must have no transaction open (it is drained first).

        Raises:
            KafkaOperationError: the transaction failed (it is aborted when it can be).
        """
        wanted = sorted(set(numbers))
        if not wanted:
            return {}
        value = OwnerRecord(str(self.transactional_id), released, self.journal).encode()
        records: list[tuple[int, bytes, bytes | None]] = []
        keys = {}
        for number in wanted:
            earlier = self._keys.get(number)
            if released and earlier is not None:
                keys[number] = earlier
            else:
                keys[number] = owner_key(str(self.transactional_id), next(self._claims))
            records.append((number, keys[number], value))
            if not released and earlier is not None:
                records.append((number, earlier, None))
        offsets = self._commit(records, "releasing" if released else "claiming", wanted)
        self._keys.update(keys)
        if released:
            self._claimed -= set(wanted)
            self._released_at.update(offsets)
        else:
            self._claimed |= set(wanted)
            self._claimed_at.update(offsets)
        return offsets

    def adopt(self, positions: Mapping[int, Positions], stale: Sequence[tuple[int, bytes]]) -> None:
        """Write ``positions`` (partition -> where the restore found it) to this incarnation's
        journal and delete the ``stale`` records (``<ns>_state`` partition, key), in one
        transaction: the owner records of earlier owners this one has fenced or found released
        before its claim, and their positions. Compaction keeps every claim's record and every
        journal's positions until then (:func:`txbridge.wire.owner_key`).

        Raises:
            KafkaOperationError: the transaction failed: nothing was written, and the partitions
                must not be served until this succeeds.
        """
        own = str(self.transactional_id)
        records: list[tuple[int, bytes, bytes | None]] = [
            (self.journal, journal_key(own, number), where.encode())
            for number, where in sorted(positions.items())
        ]
        records += [(partition, key, None) for partition, key in stale]
        if records:
            self._commit(records, "adopting the positions of", sorted({*positions, *(p for p, _ in stale)}))

    def _commit(
        self, records: Sequence[tuple[int, bytes, bytes | None]], what: str, numbers: list[int]
    ) -> dict[int, int]:
        """``records`` (partition, key, value) in one transaction of this producer's; returns
        the offset of each partition's first record."""
        offsets: dict[int, int] = {}

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                offsets.setdefault(int(msg.partition()), int(msg.offset()))

        producer = self.producer()
        try:
            with self._watchdog.deadline(f"{what} partitions {numbers}", 4 * _MARK_TIMEOUT_S):
                producer.begin_transaction()
                for number, key, value in records:
                    producer.produce(
                        self._state_topic, key=key, value=value, partition=number, on_delivery=delivered
                    )
                producer.flush(_MARK_TIMEOUT_S)  # serves the delivery reports: the offsets
                producer.commit_transaction(_MARK_TIMEOUT_S)
        except Exception as exc:
            error = kafka.to_error(exc, f"{what} partitions {numbers}")
            if not error.fatal:
                try:
                    producer.abort_transaction(_MARK_TIMEOUT_S)
                except Exception as abort_exc:  # the next transaction's begin says what is wrong
                    logger.warning("aborting the %s transaction: %s", what, abort_exc)
            raise error from exc
        return offsets

    def _ensure_producer(self, transactional_id: str) -> None:
        """This incarnation's producer under ``transactional_id``, made and initialised at its
        first claim."""
        if self._writer is not None and self.transactional_id is not None:
            return
        producer = self._initialised(
            transactional_id,
            linger_ms=5,
            # A committed message to a missing topic is quarantined (and can be requeued once the
            # topic exists), never published to a topic the broker made up with its defaults.
            allow_auto_create_topics=False,
        )
        logger.info(
            "coordinator %s commits under the transactional id %s", self.config.instance_id, transactional_id
        )
        writer = TransactionWriter(producer, self._sizes)
        partitions = writer.partitions_of(self._state_topic)
        if partitions is None:
            self._release_clients([producer])
            raise KafkaOperationError(
                f"{self._state_topic} does not exist (txbridge init makes it)", retriable=True
            )
        self.journal = journal_partition(transactional_id, partitions)
        writer.journal = (transactional_id, self.journal)
        self._writer = writer
        self.transactional_id = transactional_id

    # ------------------------------------------------------------------ letting go

    def release(self, numbers: Iterable[int]) -> None:
        """Stop counting ``numbers`` as claimed (their work is committed or abandoned). The
        producer stays: it commits the other partitions."""
        self._claimed -= set(numbers)

    def release_all(self) -> None:
        """Let go of every partition and of the producer: the next claim makes a new one, under
        a new id (an id is never reused, so no later incarnation is fenced by a claim of this
        one's)."""
        self._claimed.clear()
        self._released_at.clear()
        self._keys.clear()
        self._claimed_at.clear()
        writer, self._writer, self.transactional_id = self._writer, None, None
        if writer is not None and writer.producer is not None:
            self._release_clients([writer.producer])

    def abandon(self, number: int | None = None) -> None:
        """Forget the producer without touching it: a call on it is stuck
        (confluentinc/librdkafka#5511), and the next owner of its partitions fences it."""
        self._claimed.clear()
        self._released_at.clear()
        self._keys.clear()
        self._claimed_at.clear()
        self._writer, self.transactional_id = None, None

    @staticmethod
    def _release_clients(clients: list[Any]) -> None:
        if clients:
            # Destroying a client waits for its threads: not on the loop's thread.
            threading.Thread(target=_discard, args=(clients,), name="txbridge-release", daemon=True).start()
