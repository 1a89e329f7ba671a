"""Apache RocketMQ 5's transactional messages: half message, local transaction, end; checks.

The order service uses ``rocketmq-python-client`` as its documentation shows: a
``Producer`` with a ``TransactionChecker``; ``send(message, transaction)`` writes
the half message, the local transaction runs, then ``commit()`` or
``rollback()``. A transaction left open (an UNKNOWN outcome, a killed process)
is checked by the broker once older than ``transactionTimeOut``, every
``transactionCheckInterval``; the checker answers from a database barrier keyed
by the message id (the same :class:`~txbridge.SqlAlchemyBarrier` the txbridge
path uses), so a check is decisive and a late commit after a rollback verdict is
impossible. The gRPC proxy sends a topic's checks to any live producer of that
topic, so a replacement process answers for a killed one.

Each process appends what it did to two JSON-lines files of the run, read by the
report: ``logs/rocketmq-transactions.jsonl`` (per order: message id, how the
service ended it) and ``logs/rocketmq-checks.jsonl`` (per check: message id,
answer, when).

The topic's message type is TRANSACTION, so a message cannot also carry a message
group (FIFO): RocketMQ keeps no per-key order for transactional messages, and the
producer spreads them over the topic's queues.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from spark_pipelines import schema
from spark_pipelines.faults import Fault, PlannedOrder
from spark_pipelines.paths import CrashPoint, LocalFailure, event_for, write_order
from spark_pipelines.store import OrderStore
from txbridge.errors import ConfigurationError

if TYPE_CHECKING:
    from spark_pipelines.watcher import Received

logger = logging.getLogger(__name__)

TRANSACTIONS_LOG = "rocketmq-transactions.jsonl"
CHECKS_LOG = "rocketmq-checks.jsonl"
_REQUEST_TIMEOUT_S = 10


class _JsonLines:
    """Append-only JSON lines, one write per line (atomic on a local file opened for append)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, **fields: object) -> None:
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", buffering=1)
            self._file.write(
                json.dumps({"t_ms": int(time.time() * 1000), "pid": os.getpid(), **fields}) + "\n"
            )

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _import_rocketmq() -> Any:
    try:
        import rocketmq
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            "the rocketmq path needs rocketmq-python-client: pip install 'txbridge[rocketmq]', "
            "or skip RocketMQ with --paths txbridge,native,plain"
        ) from exc
    return rocketmq


def _barrier_checker(barrier: Any, checks: _JsonLines) -> Any:
    """A ``TransactionChecker`` answering from ``barrier`` (keyed by message id), logging to ``checks``."""
    from rocketmq import TransactionChecker, TransactionResolution

    from txbridge import TxState

    class BarrierChecker(TransactionChecker):
        def check(self, message: Any) -> Any:
            order_id = next(iter(message.keys or []), None)
            try:
                state = barrier.check(message.message_id)
            except Exception:
                logger.exception("check of %s (order %s) failed", message.message_id, order_id)
                checks.write(message_id=message.message_id, order_id=order_id, answer="error")
                raise
            answer = "commit" if state is TxState.COMMIT else "rollback"
            checks.write(message_id=message.message_id, order_id=order_id, answer=answer)
            return TransactionResolution.COMMIT if state is TxState.COMMIT else TransactionResolution.ROLLBACK

    return BarrierChecker()


class RocketMQPath:
    """Publish each order as a RocketMQ transactional message around the DB write.

    Args:
        endpoint: the RocketMQ proxy's gRPC address.
        topic: the run's topic (message type TRANSACTION).
        store: the path's order table.
        log_dir: where the transactions and checks logs go.
    """

    name = "rocketmq"

    def __init__(self, endpoint: str, topic: str, store: OrderStore, log_dir: Path) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.store = store
        self._transactions = _JsonLines(log_dir / TRANSACTIONS_LOG)
        self._checks = _JsonLines(log_dir / CHECKS_LOG)
        self._producer: Any = None
        self._barrier: Any = None

    def start(self) -> None:
        from txbridge import SqlAlchemyBarrier

        rocketmq = _import_rocketmq()
        # Its own table: with --db-url the paths share a database, and the txbridge path's
        # barrier rows are its own business.
        self._barrier = SqlAlchemyBarrier(self.store.engine, table="rocketmq_barrier")
        config = rocketmq.ClientConfiguration(
            self.endpoint, rocketmq.Credentials(), request_timeout=_REQUEST_TIMEOUT_S
        )
        checker = _barrier_checker(self._barrier, self._checks)
        self._producer = rocketmq.Producer(config, (self.topic,), checker)
        self._producer.startup()

    def handle(self, order: PlannedOrder, crash: CrashPoint) -> str:
        rocketmq = _import_rocketmq()
        producer = self._producer
        assert producer is not None, "start() first"
        event = event_for(order)
        message = rocketmq.Message()
        message.topic = self.topic
        message.body = schema.encode(event)
        message.keys = order.order_id  # RocketMQ's index key: what an operator looks a message up by
        transaction = producer.begin_transaction()
        receipt = producer.send(message, transaction)  # the half message is stored
        message_id = receipt.message_id
        if order.fault is Fault.CRASH_AFTER_BEGIN:
            self._ended(order, message_id, "none")
            crash("after_half")
        try:
            with self._barrier.local_transaction(message_id) as conn:
                write_order(self.store, conn, order)
        except LocalFailure:
            return self._end(order, message_id, transaction.rollback, "rollback", "rolled_back")
        if order.fault is Fault.CRASH_AFTER_DB_COMMIT:
            self._ended(order, message_id, "none")
            crash("after_db_commit")
        if order.fault is Fault.UNKNOWN:
            # The commit happened; the service never learned it, so it ends nothing and the
            # broker's check decides (the local transaction returned UNKNOWN).
            self._ended(order, message_id, "none")
            return "unknown"
        return self._end(order, message_id, transaction.commit, "commit", "committed")

    def _end(self, order: PlannedOrder, message_id: str, end: Any, action: str, outcome: str) -> str:
        try:
            end()
        except Exception as exc:  # the client raises its own ClientException and gRPC errors
            # The end request failed: the broker's check decides, as for UNKNOWN.
            logger.warning("order %s: %s of %s failed: %s", order.order_id, action, message_id, exc)
            self._ended(order, message_id, f"{action}_failed")
            return f"{action}_failed"
        self._ended(order, message_id, action)
        return outcome

    def _ended(self, order: PlannedOrder, message_id: str, end: str) -> None:
        self._transactions.write(order=order.index, order_id=order.order_id, message_id=message_id, end=end)

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.shutdown()
            finally:
                self._producer = None
                self._transactions.close()
                self._checks.close()


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(log_dir: Path, received: Sequence[Received] = ()) -> dict[str, Any]:
    """What RocketMQ's checks did in a run, from the producers' logs and the watcher's record.

    Returns:
        ``open_transactions``: half messages the service ended with neither COMMIT nor ROLLBACK
        (UNKNOWN outcomes, killed processes, failed end requests); ``checks``: checks the
        producers answered, and ``check_answers`` by answer; ``checked_transactions``,
        ``checked_more_than_once``; ``checks_of_ended_transactions``: checks of a transaction
        the service had already committed or rolled back (its op record was not yet seen by
        the check); ``open_never_checked``; ``first_answered_check_s``: seconds from the
        service leaving a transaction open to the first check a producer answered (p50, max;
        a check the broker sent to a killed producer is never answered, nor seen here);
        ``received_more_than_once``:
        messages (by id) the watcher received more than once, and ``redelivered``: deliveries
        with ``delivery_attempt`` > 1 (a consumer-side redelivery, not a second commit);
        ``order_violations_by_cause``: the order violations (as docs/demo.md counts them, in
        the order received) of orders the broker's check committed (``resolved_by_check``:
        late by the check's delay) and of orders the producer committed itself
        (``ended_by_producer``: overtaken across the topic's queues).
    """
    ends = {t["message_id"]: t for t in _read_lines(log_dir / TRANSACTIONS_LOG)}
    checks = _read_lines(log_dir / CHECKS_LOG)
    per_message: dict[str, list[dict[str, Any]]] = {}
    for check in checks:
        per_message.setdefault(check["message_id"], []).append(check)
    open_ids = {m for m, t in ends.items() if t["end"] not in ("commit", "rollback")}
    ended_ids = ends.keys() - open_ids
    delays = sorted(
        (min(c["t_ms"] for c in per_message[m]) - ends[m]["t_ms"]) / 1000
        for m in open_ids
        if m in per_message
    )
    answers: dict[str, int] = {}
    for check in checks:
        answers[check["answer"]] = answers.get(check["answer"], 0) + 1
    by_id: dict[str, int] = {}
    for record in received:
        by_id[record.message_id] = by_id.get(record.message_id, 0) + 1
    ended_by_order = {t["order_id"]: t["end"] for t in ends.values()}
    late = {"resolved_by_check": 0, "ended_by_producer": 0}
    for order_id in _order_violations(received):
        late["ended_by_producer" if ended_by_order.get(order_id) == "commit" else "resolved_by_check"] += 1
    return {
        "open_transactions": len(open_ids),
        "checks": len(checks),
        "check_answers": answers,
        "checked_transactions": len(per_message),
        "checked_more_than_once": sum(1 for c in per_message.values() if len(c) > 1),
        "checks_of_ended_transactions": sum(len(per_message[m]) for m in ended_ids if m in per_message),
        "open_never_checked": len(open_ids - per_message.keys()),
        "first_answered_check_s": {
            "p50": delays[len(delays) // 2] if delays else None,
            "max": delays[-1] if delays else None,
        },
        "received_more_than_once": sum(1 for n in by_id.values() if n > 1),
        "redelivered": sum(1 for r in received if r.delivery_attempt > 1),
        "order_violations_by_cause": late,
    }


def _order_violations(received: Sequence[Received]) -> list[str]:
    """Order ids whose first delivery came after a later order of the same customer."""
    highest: dict[str, int] = {}
    seen: set[str] = set()
    violations: list[str] = []
    for record in received:
        try:
            event = schema.decode(record.body)
        except ValueError:
            continue
        if event.order_id in seen:
            continue
        seen.add(event.order_id)
        if event.customer_seq < highest.get(event.customer_id, 0):
            violations.append(event.order_id)
        highest[event.customer_id] = max(event.customer_seq, highest.get(event.customer_id, 0))
    return violations
