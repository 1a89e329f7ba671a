"""Who commits a partition's work: one transactional producer per coordinator incarnation, and
the claim and release records that name it in ``<ns>_state``.

Each incarnation of a coordinator (each time its clients are built) commits under a
transactional id of its own, never used before or after
(:func:`txbridge.wire.coordinator_transactional_id`), one Kafka transaction per commit covering
every owned partition. Before it serves partition ``p`` it commits a claim record naming that
id into ``<ns>_state`` ``p`` (:meth:`Ownership.claim`); a partition it lets go to another member
gets a release record in its last transaction (:meth:`Ownership.mark`). A new owner reads the
last of these records and fences the id it names unless it was released
(``init_transactions`` on it: Kafka aborts that id's open transaction and bumps its epoch, so
the earlier owner, dead or a zombie that will wake up, can never commit again). A partition
with no record at all was served by an older txbridge under the partition's own id, which is
fenced the same way. The argument is in docs/DESIGN.md, "Ownership".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from typing import Any

from coordinator.commit import changelog
from coordinator.commit.writer import TransactionWriter
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.watchdog import Watchdog
from txbridge import kafka
from txbridge.errors import TxBridgeError
from txbridge.kafka import Producer
from txbridge.wire import OWNER_KEY, OwnerRecord, Topics, coordinator_transactional_id

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
        #: Partition -> the offset of this producer's last release record in its ``<ns>_state``.
        self._released_at: dict[int, int] = {}

    def __contains__(self, number: object) -> bool:
        return number in self._claimed

    def numbers(self) -> set[int]:
        """The partitions claimed."""
        return set(self._claimed)

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
                to_fence: dict[str, list[int]] = {}
                for number in wanted:
                    record = owners.get(number)
                    if record is None:  # an older txbridge's data, or nobody's yet
                        earlier = cfg.partition_transactional_id(number)
                    elif record.released or record.transactional_id == own:
                        continue
                    else:
                        earlier = record.transactional_id
                    to_fence.setdefault(earlier, []).append(number)
                self.fence(to_fence)
            finally:
                made.result()
        self.mark(wanted, released=False)
        self._claimed |= set(wanted)

    def _read_owners(self, numbers: list[int]) -> dict[int, OwnerRecord]:
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
        ids = sorted(earlier)
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
        it stale: the caller reads it again, and the restore fences that other owner. Checked
        after the claim is committed, so an owner claiming later finds this claim and fences
        this producer.

        Raises:
            KafkaOperationError: the claim failed.
        """
        wanted = sorted(set(numbers) - self._claimed)
        released_at = {n: self._released_at.pop(n) for n in wanted if n in self._released_at}
        offsets = self.mark(wanted, released=False)
        self._claimed |= set(wanted)
        # The release record, then its transaction's commit marker, then the claim.
        return [n for n in wanted if n in released_at and offsets.get(n) == released_at[n] + 2]

    def mark(self, numbers: Iterable[int], *, released: bool) -> dict[int, int]:
        """Commit an owner record for each of ``numbers`` in one transaction: a claim, or a
        release (the partitions may go to another member, whose claim then fences nobody).
        Released partitions are no longer claimed. Returns each record's offset.

        The commit cycle must have no transaction open (it is drained first).

        Raises:
            KafkaOperationError: the transaction failed (it is aborted when it can be).
        """
        wanted = sorted(set(numbers))
        if not wanted:
            return {}
        offsets: dict[int, int] = {}

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                offsets[int(msg.partition())] = int(msg.offset())

        producer = self.producer()
        value = OwnerRecord(str(self.transactional_id), released).encode()
        what = "releasing" if released else "claiming"
        try:
            with self._watchdog.deadline(f"{what} partitions {wanted}", 4 * _MARK_TIMEOUT_S):
                producer.begin_transaction()
                for number in wanted:
                    producer.produce(
                        self._state_topic, key=OWNER_KEY, value=value, partition=number, on_delivery=delivered
                    )
                producer.flush(_MARK_TIMEOUT_S)  # serves the delivery reports: the offsets
                producer.commit_transaction(_MARK_TIMEOUT_S)
        except Exception as exc:
            error = kafka.to_error(exc, f"{what} partitions {wanted}")
            if not error.fatal:
                try:
                    producer.abort_transaction(_MARK_TIMEOUT_S)
                except Exception as abort_exc:  # the next transaction's begin says what is wrong
                    logger.warning("aborting the %s transaction: %s", what, abort_exc)
            raise error from exc
        if released:
            self._claimed -= set(wanted)
            self._released_at.update(offsets)
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
        self._writer = TransactionWriter(producer, self._sizes)
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
        writer, self._writer, self.transactional_id = self._writer, None, None
        if writer is not None and writer.producer is not None:
            self._release_clients([writer.producer])

    def abandon(self, number: int | None = None) -> None:
        """Forget the producer without touching it: a call on it is stuck
        (confluentinc/librdkafka#5511), and the next owner of its partitions fences it."""
        self._claimed.clear()
        self._released_at.clear()
        self._writer, self.transactional_id = None, None

    @staticmethod
    def _release_clients(clients: list[Any]) -> None:
        if clients:
            # Destroying a client waits for its threads: not on the loop's thread.
            threading.Thread(target=_discard, args=(clients,), name="txbridge-release", daemon=True).start()
