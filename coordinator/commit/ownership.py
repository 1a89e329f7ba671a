"""Who commits a partition's work: one transactional producer per owned partition, named after it.

Partition ``p`` of a namespace is only ever committed under the transactional id
:meth:`CoordinatorConfig.partition_transactional_id` ``(p)``, by whichever coordinator owns
it. A new owner initialises that id (:meth:`PartitionProducers.claim`) before it reads
anything of the partition. Kafka then aborts any transaction an earlier owner of ``p`` left
open, waits until its abort markers are written, and bumps the id's epoch, so the earlier
owner (dead, or a zombie that will wake up) can never commit again. None of this depends on
how coordinators are named: the name a fence needs is the partition's, which every owner knows.
The argument is in docs/DESIGN.md, "Ownership".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coordinator.commit.writer import TransactionWriter
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.watchdog import Watchdog
from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import Producer

logger = logging.getLogger(__name__)

#: Partitions claimed at once: each claim is a few round trips to the transaction coordinator
#: (and 0.5 s when an earlier owner's transaction must be aborted first), so a coordinator
#: that takes twelve partitions over waits for about one of them, not twelve.
_CLAIM_THREADS = 8
_INIT_TIMEOUT_S = 30.0


def _discard(clients: list[Any]) -> None:
    """Drop the last references to released producers here, so that their destruction waits here."""
    for client in clients:
        try:
            client.flush(0)
        except Exception as exc:  # a fenced or fatal producer has nothing worth delivering
            logger.debug("flushing a released producer: %s", exc)
    clients.clear()


class PartitionProducers:
    """The transactional producers of the partitions one coordinator owns.

    Args:
        config: the coordinator's settings (bootstrap, client settings, transaction timeout).
        watchdog: reports an ``init_transactions`` that outlives its timeout.
    """

    def __init__(self, config: CoordinatorConfig, watchdog: Watchdog) -> None:
        self.config = config
        self._watchdog = watchdog
        self._writers: dict[int, TransactionWriter] = {}
        self._sizes: dict[str, tuple[int | None, float]] = {}  # shared partition-count cache

    def __contains__(self, number: object) -> bool:
        return number in self._writers

    def numbers(self) -> set[int]:
        """The partitions claimed."""
        return set(self._writers)

    def writer(self, number: int) -> TransactionWriter:
        return self._writers[number]

    def producer(self, number: int) -> Producer:
        return kafka.opened(self._writers[number].producer, f"partition {number}'s producer")

    def claim(self, numbers: Iterable[int]) -> None:
        """Initialise the producers of ``numbers``: from here on no earlier owner commits them.

        Raises:
            KafkaOperationError: a producer could not be initialised (none of ``numbers`` is
                claimed then).
        """
        wanted = sorted(set(numbers) - set(self._writers))
        if not wanted:
            return
        with ThreadPoolExecutor(min(_CLAIM_THREADS, len(wanted)), "txbridge-claim") as pool:
            outcomes = list(pool.map(self._initialised, wanted))
        failed = [o for o in outcomes if isinstance(o, KafkaOperationError)]
        made = [o for o in outcomes if not isinstance(o, KafkaOperationError)]
        if failed:
            self._release_clients(made)
            raise failed[0]
        for number, producer in zip(wanted, made, strict=True):
            self._writers[number] = TransactionWriter(producer, self._sizes)

    def _initialised(self, number: int) -> Producer | KafkaOperationError:
        cfg = self.config
        transactional_id = cfg.partition_transactional_id(number)
        producer = kafka.producer(
            cfg.bootstrap,
            cfg.extra_config,
            transactional_id=transactional_id,
            transaction_timeout_ms=cfg.transaction_timeout_ms,
            linger_ms=5,
            # A committed message to a missing topic is quarantined (and can be requeued once the
            # topic exists), never published to a topic the broker made up with its defaults.
            allow_auto_create_topics=False,
        )
        try:
            with self._watchdog.deadline(f"init_transactions of {transactional_id}", 2 * _INIT_TIMEOUT_S):
                kafka.init_transactions(producer, _INIT_TIMEOUT_S)
        except Exception as exc:
            self._release_clients([producer])
            return kafka.to_error(exc, f"claiming partition {number} (transactional id {transactional_id})")
        return producer

    def release(self, numbers: Iterable[int]) -> None:
        """Let go of the producers of ``numbers`` (their transactions are committed or abandoned)."""
        gone = [self._writers.pop(n) for n in sorted(set(numbers)) if n in self._writers]
        self._release_clients([w.producer for w in gone if w.producer is not None])

    def release_all(self) -> None:
        self.release(list(self._writers))

    def abandon(self, number: int) -> None:
        """Forget partition ``number``'s producer without touching it: a call on it is stuck
        (confluentinc/librdkafka#5511), and the next claim of the partition fences it."""
        self._writers.pop(number, None)

    @staticmethod
    def _release_clients(clients: list[Any]) -> None:
        if clients:
            # Destroying a client waits for its threads: not on the loop's thread.
            threading.Thread(target=_discard, args=(clients,), name="txbridge-release", daemon=True).start()
