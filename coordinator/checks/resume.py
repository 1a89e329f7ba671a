"""Expired transactions re-checked when their producer group comes back.

A transaction expires after ``max_checks`` UNKNOWN answers (RocketMQ's bound): the
coordinator rolls it back and copies it to ``<ns>_expired``. RocketMQ stops there, so
a transaction whose local commit happened while its group was down is lost to its
consumers until an operator notices. Here, when an instance of a group becomes live
again (a heartbeat in ``<ns>_producers`` from an instance that was not live at the
previous look), the coordinator asks that group about its expired transactions on
the partitions it owns, in the order their producers wrote them, at most
``resume_expired_max`` per return:

- COMMIT: the messages are published and a marker is written to ``<ns>_expired``, in
  one Kafka transaction, through the same exactly-once step as ``txbridge admin
  resolve`` (:func:`txbridge.admin._once.decide_once`: fenced per transaction, so an
  operator resolving it at the same moment, or another coordinator, cannot publish it
  twice);
- ROLLBACK: a ROLLBACK marker, so it is not asked about again;
- anything else: it stays expired, and is asked again the next time the group returns.

They are resolved one at a time in half order (partition, then the offset of their
first half), so same-key transactions among them keep the producers' order, as every
other republish does (DESIGN.md, per-key order). Expiry order is not that order: a
transaction's expiry waits for its own back-checks, which end in whatever order the
endpoints answer. They go out after the same-key transactions published while they
were expired (those could not wait for a group that was down).

The work runs on a thread of its own: a resolution takes a fencing round trip and a
read of ``<ns>_expired``, which the coordinator's loop must not wait for.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.checks.checker import Checker, CheckJob
from coordinator.monitoring.metrics import Stat
from txbridge.errors import TxBridgeError
from txbridge.wire import CheckMessage, CheckRequest, TxState, can_answer

if TYPE_CHECKING:
    from txbridge.admin import ExpiredTx

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Return:
    """A group with an instance that became live, and its live instances then:
    ``(instance, check source, URL)``, the ones heard from lately first."""

    group: str
    instances: tuple[tuple[str, str | None, str], ...]

    def targets(self, entry: ExpiredTx) -> tuple[str, ...]:
        """Where to ask about ``entry``: its writer first, then the instances that can answer
        for its check source (:func:`txbridge.wire.can_answer`); none when none can."""
        writer = entry.messages[0].instance if entry.messages else ""
        source = entry.messages[0].source if entry.messages else None
        able = [
            (inst != writer, url)
            for inst, inst_source, url in self.instances
            if can_answer(writer=writer, tx_source=source, instance=inst, instance_source=inst_source)
        ]
        return tuple(url for _later, url in sorted(able, key=lambda pair: pair[0]))


class ExpiryResumer:
    """Re-checks the expired transactions of groups that came back (see the module docstring).

    Args:
        bootstrap: Kafka bootstrap servers.
        namespace: the txbridge namespace.
        checker: the coordinator's checker (its HTTP client, secrets and allow-list).
        owned: the half/op partitions this coordinator owns now (called from this thread).
        limit: at most this many expired transactions asked about per return of a group.
        extra: librdkafka settings for every client.
    """

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        checker: Checker,
        *,
        owned: Callable[[], set[int]],
        limit: int,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap, self._namespace, self._extra = bootstrap, namespace, dict(extra or {})
        self._checker, self._owned, self._limit = checker, owned, limit
        self._returns: queue.SimpleQueue[Return | None] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[Stat] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._live: set[tuple[str, str]] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txbridge-resume", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._returns.put(None)
            self._thread.join(30)
            self._thread = None

    def observe(
        self, live: set[tuple[str, str]], instances: Callable[[str], tuple[tuple[str, str | None, str], ...]]
    ) -> None:
        """The live (group, instance) pairs now; a group with one not live before is queued.

        The first call queues every live group: expiries left from before this coordinator
        started are asked about once too.
        """
        came_back = {group for group, instance in live - self._live}
        self._live = set(live)
        for group in sorted(came_back):
            self._returns.put(Return(group, instances(group)))

    def events(self) -> list[Stat]:
        """Counters of what happened since the last call (for the loop's stats)."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while True:
            item = self._returns.get()
            if item is None:
                return
            try:
                self._resume(item)
            except Exception:  # a bad pass must not end the thread: the next return tries again
                logger.exception("re-checking expired transactions of group %r failed", item.group)

    def _resume(self, back: Return) -> None:
        # Imported here: txbridge.admin is the CLI's, which loads the bench, which imports this
        # package; importing it at the top would close that cycle.
        from txbridge.admin import list_expired, resolve

        owned = self._owned()
        expired = sorted(
            (
                e
                # Open transactions included: the expiry counted before this return may still be
                # committing (the coordinator counts it when it fills the Kafka transaction).
                for e in list_expired(self._bootstrap, self._namespace, self._extra, wait_for_open=True)
                if e.group == back.group and e.resolved is None and e.partition in owned and e.messages
            ),
            key=_half_order,
        )
        if not expired:
            return
        batch = expired[: self._limit]
        logger.info(
            "group %r is live again: re-checking %d of its %d expired transactions",
            back.group,
            len(batch),
            len(expired),
        )
        for entry in batch:  # one at a time, in half order: same-key ones keep their order
            self._events.put(Stat.EXPIRED_RECHECKED)
            targets = back.targets(entry)
            if not targets:
                logger.info(
                    "expired tx %s: no live instance of group %r answers for its writer's source of truth; "
                    "asked when one returns",
                    entry.tx_id,
                    entry.group,
                )
                continue
            job = CheckJob(entry.partition or 0, _request(entry), targets)
            result = self._checker.check_batch([job])[0]
            if result.state is TxState.UNKNOWN:
                logger.info("expired tx %s: still undecided (%s)", entry.tx_id, result.detail)
                continue
            try:
                resolve(self._bootstrap, entry.tx_id, result.state, self._namespace, self._extra, entry=entry)
            except TxBridgeError as exc:  # already resolved by an admin, a topic gone, Kafka down
                logger.warning(
                    "expired tx %s answered %s but was not resolved: %s", entry.tx_id, result.state, exc
                )
                continue
            committed = result.state is TxState.COMMIT
            self._events.put(Stat.EXPIRED_RESUMED if committed else Stat.EXPIRED_ROLLED_BACK)
            logger.info(
                "expired tx %s of group %r: %s after its group came back",
                entry.tx_id,
                entry.group,
                result.state,
            )


def _half_order(entry: ExpiredTx) -> tuple[int, int]:
    return (entry.partition or 0, entry.first_offset if entry.first_offset is not None else -1)


def _request(entry: ExpiredTx) -> CheckRequest:
    messages = tuple(CheckMessage(m.topic, m.key, m.user_headers) for m in entry.messages)
    instance = entry.messages[0].instance if entry.messages else ""
    return CheckRequest(entry.tx_id, entry.group, instance, entry.checks + 1, messages)
