"""The coordinator's back-checks: which open transactions are asked about, in which requests to
which producer instances, and what an answer does to a transaction.

:class:`BackChecks` is one of the coordinator's collaborators (see ``docs/DESIGN.md``, "The
coordinator's parts"). It plans and applies; the :class:`~coordinator.checks.checker.Checker` sends
the HTTP requests on its own threads. It shares with the service, by reference, the owned
partitions' states and the commit's inputs an answer feeds: the batch of op records written in
the next Kafka transaction, the partitions with a transaction ready to republish, and the
transactions whose checks are exhausted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from coordinator.checks.checker import Checker, CheckJob, CheckResult
from coordinator.checks.registry import ProducerRegistry
from coordinator.checks.resume import ExpiryResumer
from coordinator.commit.payloads import HalfReader
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.metrics import Stat, Stats
from coordinator.state import scheduler
from coordinator.state.partition import PartitionState, PendingTx, Phase
from coordinator.state.republisher import Batch
from coordinator.state.scheduler import CheckPolicy
from txbridge.errors import KafkaOperationError
from txbridge.wire import CheckMessage, CheckRequest, OpRecord, OpSource, TxState

logger = logging.getLogger(__name__)

REGISTRY_WAIT_S = 10.0  # checks wait at most this long after start for the registry to be read
RUNNING_LOG_S = 60.0  # a group answering RUNNING is logged at most this often


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BackChecks:
    """Plans the back-checks of the owned partitions and applies their answers.

    Args:
        config: the coordinator's settings (``check_batch_size``, ``check_invariants``).
        policy: when a transaction is due, and when its checks are exhausted.
        stats: the coordinator's counters.
        partitions: the owned partitions' states (the service's dict, read as it changes).
        batch: the op records of the next Kafka transaction; a verdict is written there.
        ready: partitions with a transaction ready to republish; a COMMIT verdict adds one.
        expiring: tx id -> transaction whose checks are exhausted (the commit expires it).
        checker, registry, reader: the HTTP sender, the producer registry, the half re-reader.
        now_ms: the clock (tests).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        policy: CheckPolicy,
        stats: Stats,
        partitions: Mapping[int, PartitionState],
        *,
        batch: Batch,
        ready: set[int],
        expiring: dict[str, PendingTx],
        checker: Checker,
        registry: ProducerRegistry,
        reader: HalfReader,
        now_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.config = config
        self.policy = policy
        self.stats = stats
        self.partitions = partitions
        self._batch = batch
        self._ready = ready
        self._expiring = expiring
        self._checker = checker
        self._registry = registry
        self._reader = reader
        self._now_ms = now_ms
        self._started = time.monotonic()
        # Writers found gone (silent, or left: True) and expedited, with when: their transactions
        # that arrive later are expedited too, while they stay silent or for a liveness period
        # after they left (their halves can still be on the way, or behind in the topic).
        self._gone: dict[tuple[str, str], tuple[int, bool]] = {}
        self._left: set[tuple[str, str]] = set()  # decisive instances that left, not expedited yet
        self._arrivals = 0  # the owned partitions' arrivals at the last look
        self._awaiting: set[tuple[str, str, str | None]] = set()  # writers said to be waited for
        self._running_logged: dict[str, float] = {}  # group -> when a RUNNING answer was last logged

    def registry_read(self) -> bool:
        """The producer registry was read to its end (or 10 s went by trying: checks go ahead)."""
        return self._registry.caught_up or time.monotonic() > self._started + REGISTRY_WAIT_S

    # ------------------------------------------------------------------ asking

    def schedule(self, caught_up: list[int]) -> None:
        """Send the checks now due on ``caught_up``: owned partitions whose op partition is read
        past where it ended at the previous look, so no producer's decision is still unread."""
        now = self._now_ms()
        in_flight = self._checker.in_flight_txs
        # One request asks about up to check_batch_size transactions of one group and writer.
        batches: dict[tuple[str, tuple[str, ...]], list[tuple[int, PendingTx]]] = {}
        # (group, writer, its check source) -> URLs, once per pass
        targets: dict[tuple[str, str, str | None], tuple[str, ...]] = {}
        for number in caught_up:
            state = self.partitions[number]
            due = state.due_checks(self.policy, now, in_flight)
            self._expiring.update((t.tx_id, t) for t in due.expire)
            for tx in due.check:
                writer = (tx.group, tx.instance, tx.check_source)
                if writer not in targets:
                    targets[writer] = tuple(self._registry.view.targets(*writer, now))
                    if not targets[writer]:
                        self._note_no_answerer(writer, now)
                if not targets[writer]:
                    self.stats[Stat.CHECKS_AWAITING_WRITER] += 1
                batches.setdefault((tx.group, targets[writer]), []).append((number, tx))
        # Plan every request of the pass first, within each group's free request slots (the rest
        # wait for a later pass), so that evicted or restored payloads are re-read in one go: one
        # read per half partition per pass, not one per request (a request's transactions span
        # the partitions, so reading per request re-read each partition once per request).
        size = self.config.check_batch_size
        slots = {group: self._checker.free_slots(group) for group, _urls in batches}
        planned: list[tuple[tuple[str, ...], list[tuple[int, PendingTx]]]] = []
        for (group, urls), txs in batches.items():
            for start in range(0, len(txs), size):
                if slots[group] == 0:
                    break
                slots[group] -= 1
                planned.append((urls, txs[start : start + size]))
        self._load_payloads([tx for _urls, part in planned for _number, tx in part])  # checks show headers
        for urls, part in planned:
            chunk = [CheckJob(number, self._request(tx), urls) for number, tx in part]
            if not self._checker.submit_batch(chunk):
                continue  # cannot happen while only this loop takes slots; asked at a later pass
            self.stats[Stat.CHECKS] += len(chunk)
            self.stats[Stat.CHECK_REQUESTS] += 1

    def _note_no_answerer(self, writer: tuple[str, str, str | None], now: int) -> None:
        """Say, once per writer, why its transactions are not asked although its group is live."""
        group, instance, source = writer
        if writer in self._awaiting or not self._registry.view.instances_of(group, now):
            return  # said already, or the whole group is down (the checker says that)
        self._awaiting.add(writer)
        logger.warning(
            "producer %s/%s is not live and no live instance of group %r answers for its check source "
            "%r (a barrier on another database, or a check that answers for its own instance only): its "
            "transactions wait for it (checks_awaiting_writer), and expire after max_unasked_s",
            group,
            instance,
            group,
            source,
        )

    def _request(self, tx: PendingTx) -> CheckRequest:
        return CheckRequest(
            tx_id=tx.tx_id,
            group=tx.group,
            instance=tx.instance,
            attempt=tx.checks + 1,
            messages=tuple(_message(tx, seq) for seq in sorted(tx.halves)),
        )

    def _load_payloads(self, txs: list[PendingTx]) -> None:
        """Re-read evicted payloads of ``txs``; on failure the checks go without user headers."""
        try:
            self._reader.load(txs)
        except KafkaOperationError as exc:
            logger.warning("re-reading half records for back-checks: %s (sent without headers)", exc)

    # ------------------------------------------------------------------ producers gone and back

    def expedite_gone_writers(self) -> None:
        """A writer that went silent or left: its transactions are checked now, not after the delay,
        when another live instance of its group answers decisively.

        The check delay protects a local transaction that is merely slow. A writer that stopped
        heartbeating is most likely dead, and with a decisive check (the database barrier) even
        a local transaction still in flight cannot commit after a ROLLBACK answer, so asking
        another instance early is safe; with an ordinary check it waits for the delay as before.
        A gone writer's transactions that arrive after it was found gone (its last halves were
        still being read) are expedited at the next look too: found gone once is not enough.
        """
        view, now = self._registry.view, self._now_ms()
        self._left |= view.left  # a tombstoned instance is no longer in the view: remember it
        view.left = set()
        silent = view.silent(now)
        # One that beats again is watched afresh; one that left is kept a liveness period.
        self._gone = {
            writer: (since, left)
            for writer, (since, left) in self._gone.items()
            if (now - since <= view.liveness_ms if left else writer in silent)
        }
        arrivals = sum(state.arrivals for state in self.partitions.values())
        arrived, self._arrivals = arrivals != self._arrivals, arrivals
        found = sorted((silent | self._left) - self._gone.keys())
        again = sorted(self._gone) if arrived else []
        for group, instance in found + again:
            if not view.decisive_elsewhere(group, instance, now):
                continue  # looked at again next time: another instance may come
            if (group, instance) not in self._gone:
                left = (group, instance) in self._left
                self._left.discard((group, instance))
                self._gone[group, instance] = (now, left)
            count = sum(state.expedite(group, instance, now) for state in self.partitions.values())
            if count:
                self.stats[Stat.CHECKS_EXPEDITED] += count
                logger.info(
                    "producer %s/%s is gone: its %d open transactions are checked now", group, instance, count
                )

    def observe_returns(self, resumer: ExpiryResumer) -> None:
        """Hand the resumer the live producer instances; count what it did since the last look."""
        view, now = self._registry.view, self._now_ms()
        resumer.observe(view.live(now), lambda group: view.instances_of(group, now))
        for name in resumer.events():
            self.stats[name] += 1

    # ------------------------------------------------------------------ answers

    def apply_results(self) -> None:
        """Apply every answer the checker has received since the last call."""
        for result in self._checker.results():
            self.stats[Stat.CHECKS_REFUSED] += result.refused
            self._apply(result)

    def _apply(self, result: CheckResult) -> None:
        request = result.job.request
        state = self.partitions.get(result.job.partition)
        tx = state.pending.get(request.tx_id) if state else None
        if state is None or tx is None or tx.phase is not Phase.OPEN:
            return  # revoked meanwhile, or decided by an op that arrived first
        self._apply_answer(state, tx, result)
        if self.config.check_invariants:
            # Every way a check can end leaves the transaction decided or due again, never neither.
            assert (
                tx.phase is not Phase.OPEN
                or tx.tx_id in self._expiring
                or (tx.next_check_ms is not None and tx.next_check_ms > self._now_ms() - 1000)
            ), f"check of {tx!r} ended ({result.detail}) with no decision and no next check"

    def _apply_answer(self, state: PartitionState, tx: PendingTx, result: CheckResult) -> None:
        if not result.asked:  # not an answer: does not use up max_checks (see CheckResult)
            self.stats[Stat.CHECKS_NOT_ASKED] += 1
            logger.debug("tx %s not checked: %s", tx.tx_id, result.detail)
            if scheduler.record_not_asked(self.policy, tx, self._now_ms(), result.detail):
                self._expiring[tx.tx_id] = tx
            return
        if result.state is TxState.RUNNING:
            self.stats[Stat.CHECKS_RUNNING] += 1
            self._note_running(tx, result.detail)
            scheduler.record_running(self.policy, tx, self._now_ms())
            return
        if result.state is TxState.UNKNOWN:
            self.stats[Stat.CHECKS_UNKNOWN] += 1
            logger.debug("check %d of tx %s: UNKNOWN (%s)", tx.checks + 1, tx.tx_id, result.detail)
            if scheduler.record_unknown(self.policy, tx, self._now_ms()):
                self._expiring[tx.tx_id] = tx
            return
        self.stats[Stat.CHECK_VERDICTS] += 1
        logger.debug("check of tx %s: %s from %s", tx.tx_id, result.state, result.detail)
        tx.checks += 1
        # Applied in memory now and written as an op record in the same Kafka transaction.
        state.on_op(OpRecord(tx.tx_id, result.state, OpSource.CHECK, group=tx.group))
        if tx.phase is Phase.READY:
            self._ready.add(state.partition)
        self._batch.op(state.partition, tx.tx_id, result.state, OpSource.CHECK, group=tx.group)

    def _note_running(self, tx: PendingTx, detail: str) -> None:
        """Log, at most once a minute per group, that a group keeps transactions open as RUNNING."""
        now = time.monotonic()
        last = self._running_logged.get(tx.group)
        self._running_logged[tx.group] = last if last is not None and now - last < RUNNING_LOG_S else now
        if last is None or now - last >= RUNNING_LOG_S:
            logger.info(
                "producer group %s answers RUNNING for transaction %s (%s): its local work goes on, "
                "so it is asked again without using up max_checks (checks_running counts these)",
                tx.group,
                tx.tx_id,
                detail,
            )


def _message(tx: PendingTx, seq: int) -> CheckMessage:
    ref = tx.halves[seq]
    headers = ref.message.user_headers if ref.message is not None else ()
    return CheckMessage(ref.topic, ref.key, headers)
