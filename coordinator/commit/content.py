"""What one partition puts into the commit's Kafka transaction, in order.

Ready committed transactions are republished in decision order; those that cannot
be (too large, missing topic, refused, halves deleted) are quarantined whole;
incomplete and expired ones are copied aside; then the batched records (op
records, quarantined input); last the ``<ns>_state`` changelog entries and the
partition's positions record. One Kafka transaction covers every owned partition with
work (see :mod:`coordinator.commit.cycle`); a :class:`TransactionContent` writes one
partition's share of it, so everything here concerns that partition.
"""

from __future__ import annotations

import logging

from coordinator.commit import changelog, tracing
from coordinator.commit.writer import TransactionWriter
from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state.partition import PartitionState, PendingTx, Phase
from coordinator.state.republisher import Batch, OutRecord, copy_aside, plan_republish
from txbridge.wire import OpSource, Topics, TxState, journal_key

logger = logging.getLogger(__name__)


class TransactionContent:
    """Fills a partition's share of the open Kafka transaction; its state moves as records are produced.

    Args:
        writer: the partition's transactional producer wrapper.
        topics: the namespace's topics.
        state: the partition's state (shared with the service).
        stats: the service's counters.
        max_message_bytes: larger messages are quarantined instead of republished.
        spans: the republish spans (:mod:`coordinator.commit.tracing`).
    """

    def __init__(
        self,
        writer: TransactionWriter,
        topics: Topics,
        state: PartitionState,
        stats: Stats,
        max_message_bytes: int,
        *,
        spans: tracing.NoSpans = tracing.NO_SPANS,
    ) -> None:
        self.writer = writer
        self.spans = spans
        self.topics = topics
        self.state = state
        self.stats = stats
        self.max_message_bytes = max_message_bytes

    def write(
        self,
        ready: list[PendingTx],
        expiring: list[PendingTx],
        incomplete: list[tuple[PendingTx, str]],
        batch: Batch,
    ) -> None:
        """Republish ``ready`` in order, set aside ``incomplete`` and ``expiring``, then the
        partition's records of ``batch``."""
        for tx in ready:
            messages = [ref.message for ref in tx.ordered_halves() if ref.message is not None]
            if len(messages) < len(tx.halves):  # past the half topic's retention: never republish a part
                reason = f"{len(tx.halves) - len(messages)} half record(s) can no longer be read"
                self._set_aside(tx, reason, self.topics.quarantine, Phase.QUARANTINED)
                continue
            plan = self.writer.poisoned.pop(tx.tx_id, None) or plan_republish(
                messages, self.max_message_bytes, self.writer.partitions_of
            )
            refused = (
                plan if isinstance(plan, str) else self.spans.republish(self.writer, tx.tx_id, messages, plan)
            )
            if refused is not None:
                self._set_aside(tx, refused, self.topics.quarantine, Phase.QUARANTINED)
                continue
            self.stats[Stat.MESSAGES_REPUBLISHED] += len(plan)
            self.state.finish(tx, Phase.PUBLISHED)
        for tx, reason in incomplete:
            if tx.phase is Phase.COMMITTED:
                self._set_aside(tx, reason, self.topics.quarantine, Phase.QUARANTINED)
        for tx in expiring:
            reason = f"no decision after {tx.checks} back-checks"
            if tx.unasked_since_ms is not None:
                reason = f"{reason}; none could be sent lately: {tx.problem}"
            logger.warning("tx %s of group %r expired: %s", tx.tx_id, tx.group, reason)
            batch.op(tx.partition, tx.tx_id, TxState.ROLLBACK, OpSource.EXPIRY, group=tx.group, reason=reason)
            self._set_aside(tx, reason, self.topics.expired, Phase.EXPIRED)
        for record in batch.records_of(self.state.partition):
            self.writer.produce(record)

    def _set_aside(self, tx: PendingTx, reason: str, topic: str, phase: Phase) -> None:
        if phase is Phase.QUARANTINED:
            logger.error("committed tx %s quarantined: %s", tx.tx_id, reason)
        for ref in tx.ordered_halves():
            if ref.message is None:
                continue
            origin = f"{self.topics.half}/{tx.partition}/{ref.offset}"
            checks = tx.checks if phase is Phase.EXPIRED else None
            self.writer.produce(copy_aside(topic, ref.message, reason, origin, checks))
        self.state.finish(tx, phase)

    def write_changelog(self, position: int | None, young_budget: int) -> changelog.Plan:
        """``<ns>_state`` entries and tombstones; young transactions listed in the offset instead.

        Args:
            position: the half offset this transaction commits.
            young_budget: characters of committed-offset metadata for young transactions (0: none).

        Returns:
            What was written, for :meth:`PartitionState.mark_persisted` once the transaction
            commits; the plan's ``metadata`` goes with the half partition's offset.
        """
        number = self.state.partition
        plan = changelog.plan(self.state, position, young_budget)
        for tx_id in plan.tombstones:
            self.writer.produce(OutRecord(self.topics.state, tx_id.encode(), None, [], number))
        for tx in plan.entries:
            self.writer.produce(
                OutRecord(self.topics.state, tx.tx_id.encode(), changelog.encode_entry(tx), [], number)
            )
        return plan

    def write_positions(self, where: changelog.Positions) -> None:
        """The partition's positions record: where this transaction leaves half and op, and the
        young transactions it lists (what a next owner resumes from). In the incarnation's
        journal, one ``<ns>_state`` partition for all it owns: a transaction then covers one
        partition more, not one per partition it covers (docs/DESIGN.md, "Ownership")."""
        owner, journal = self.writer.journal
        key = journal_key(owner, self.state.partition)
        self.writer.produce(OutRecord(self.topics.state, key, where.encode(), [], journal))
