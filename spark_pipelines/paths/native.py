"""Native Kafka transactions: begin, produce, DB commit, Kafka commit.

Errors are handled as confluent-kafka documents for a transactional producer. A
transaction that failed before the DB write (produce refused: librdkafka put it in
an abortable state) is aborted and begun again, so the order goes out once. A
commit that fails retriably is retried; one that needs an abort after the DB commit
is aborted, and that order is in the DB but not in Kafka: native's gap, which the
report counts as lost.

A lost commit result (``Fault.UNKNOWN``) is a real timeout: ``commit_transaction``
is given 1 ms, and the call is resumed as confluent-kafka documents for a retriable
error (:meth:`NativePath._resume_commit`). A restarted process reuses the
transactional id, so ``init_transactions`` fences the killed one and aborts its open
transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spark_pipelines import schema
from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.paths import CrashPoint, LocalFailure, event_for, write_order
from spark_pipelines.schema import OrderCreated
from spark_pipelines.store import OrderStore
from txbridge import kafka
from txbridge.kafka import KafkaError

logger = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
#: Transactions begun for one order when produce keeps being refused.
_ATTEMPTS = 3


class NativePath:
    """Publish each order inside its own Kafka transaction around the DB commit."""

    name = "native"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        store: OrderStore,
        transactional_id: str,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        self.topic = topic
        self.store = store
        self.transactional_id = transactional_id
        self._producer: kafka.Producer | None = None

    def start(self) -> None:
        self._producer = kafka.producer(
            self.bootstrap, self.extra, transactional_id=self.transactional_id, transaction_timeout_ms=60_000
        )
        kafka.init_transactions(self._producer, _TIMEOUT_S)

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        producer = self._opened()
        self._begin_and_produce(event_for(order))
        if order.fault is Fault.CRASH_AFTER_BEGIN:
            producer.flush(_TIMEOUT_S)  # the record is in the log, uncommitted
            crash("after_begin")
        try:
            with self.store.transaction() as conn:
                write_order(self.store, conn, order)
        except LocalFailure:
            self._abort()
            return "rolled_back"
        if order.fault is Fault.CRASH_AFTER_DB_COMMIT:
            producer.flush(_TIMEOUT_S)
            crash("after_db_commit")
        return self._commit(0.001 if order.fault is Fault.UNKNOWN else _TIMEOUT_S)

    def _begin_and_produce(self, event: OrderCreated) -> None:
        """Begin a transaction holding ``event``; one that fails before the DB write is begun again.

        librdkafka refuses a produce (``_STATE``) once the transaction has failed underneath it;
        CI saw it on a transaction's first record, in a process whose ``init_transactions`` had
        waited for the killed process's transaction to be aborted. Nothing of the order is in
        the DB yet, so aborting and beginning again publishes it once.
        """
        producer = self._opened()
        for attempt in range(1, _ATTEMPTS + 1):
            producer.begin_transaction()
            try:
                producer.produce(self.topic, key=event.key(), value=schema.encode(event))
            except kafka.KafkaException as exc:
                error = kafka.to_error(exc, f"producing order {event.order_id}")
                if error.fatal or attempt == _ATTEMPTS:
                    raise error from exc
                logger.warning("%s; aborting the transaction and beginning it again", error)
                self._abort()
            else:
                return

    def _commit(self, timeout: float) -> str:
        producer = self._opened()
        try:
            producer.commit_transaction(timeout)
        except kafka.KafkaException as exc:
            error = kafka.to_error(exc, "commit_transaction")
            if error.retriable:
                self._resume_commit()
                return "committed_after_retry"
            if not error.txn_requires_abort:
                raise error from exc
        else:
            return "committed"  # with Fault.UNKNOWN: the commit beat the 1 ms timeout
        logger.warning("%s after the DB commit: aborting; the order is not published", error)
        self._abort()
        return "aborted_after_db_commit"

    def _resume_commit(self) -> None:
        """Resume a commit whose call timed out; then a new producer under the same id.

        librdkafka (2.16.0, and its master branch) hands each step of a transactional call
        its answer through one slot. A step of the timed-out call that the client's thread runs
        after the resumed call began answers one of the resumed call's steps, and the resumed
        call's own answer is left over for the next step. Reproduced under CPU load
        (docs/results/2026-11-27-native-resume.md): the resumed call skips EndTxn and fails
        with ``_STATE`` ("Operation not valid in state BeginCommit"); or it returns before
        its last step ran, and the producer's next
        ``begin_transaction`` returns before the transaction has begun, so the produce is
        refused. A ``_STATE`` failure leaves the transaction being committed and consumes the
        extra answer: one more call commits it. The producer is replaced afterwards, so a
        left-over answer cannot reach the next order (a fresh ``init_transactions`` finds the
        transaction committed: nothing to abort).
        """
        producer = self._opened()
        try:
            producer.commit_transaction(_TIMEOUT_S)
        except kafka.KafkaException as exc:
            error = kafka.to_error(exc, "resuming commit_transaction")
            if error.code != KafkaError._STATE:
                raise error from exc
            logger.info("%s: librdkafka's left-over answer; resuming the commit once more", error)
            producer.commit_transaction(_TIMEOUT_S)
        self.close()
        self.start()

    def _abort(self) -> None:
        producer = self._opened()
        # Flush first: librdkafka 2.16 against Kafka 4.1 fails fatally (INVALID_TXN_STATE)
        # when EndTxn(abort) races a produce still in flight.
        producer.flush(_TIMEOUT_S)
        producer.abort_transaction(_TIMEOUT_S)

    def _opened(self) -> kafka.Producer:
        assert self._producer is not None, "start() first"
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(_TIMEOUT_S)
            self._producer = None
