"""CheckQueue alone: which OPEN transactions are due, from its FIFO, heap and due set (no broker)."""

from __future__ import annotations

from coordinator.state.check_queue import CheckQueue
from coordinator.state.pending import HalfRef, PendingTx
from coordinator.state.phase import Phase
from coordinator.state.scheduler import CheckPolicy

POLICY = CheckPolicy(delay_s=5.0, max_checks=3)


def open_tx(tx_id: str, append_ms: int, **fields: object) -> PendingTx:
    return PendingTx(tx_id, 0, halves={0: HalfRef(0, 10)}, first_append_ms=append_ms, **fields)  # type: ignore[arg-type]


def queue_of(*txs: PendingTx, slack: int = 1024) -> tuple[CheckQueue, dict[str, PendingTx]]:
    pending: dict[str, PendingTx] = {}
    queue = CheckQueue(pending, slack)
    for tx in txs:
        pending[tx.tx_id] = tx
        queue.add(tx, arriving=True)
    return queue, pending


def ids(txs: list[PendingTx]) -> list[str]:
    return [t.tx_id for t in txs]


def test_first_checks_come_due_in_arrival_order_at_append_time_plus_delay() -> None:
    queue, _ = queue_of(open_tx("a", 1000), open_tx("b", 2000))
    assert queue.due_checks(POLICY, 5999, set()).check == []
    due = queue.due_checks(POLICY, 6000, set())
    assert ids(due.check) == ["a"]
    assert due.check[0].next_check_ms == 6000
    assert ids(queue.due_checks(POLICY, 7000, set()).check) == ["a", "b"]  # due until rescheduled


def test_a_rescheduled_transaction_is_due_again_at_its_new_time_only() -> None:
    queue, pending = queue_of(open_tx("a", 1000))
    assert ids(queue.due_checks(POLICY, 6000, set()).check) == ["a"]
    pending["a"]._next_check_ms = 9000
    queue.not_due("a")
    queue.push(9000, "a")
    assert queue.due_checks(POLICY, 8999, set()).check == []
    assert ids(queue.due_checks(POLICY, 9000, set()).check) == ["a"]


def test_in_flight_ones_are_skipped_and_exhausted_ones_expire() -> None:
    queue, _ = queue_of(open_tx("a", 0), open_tx("b", 0), open_tx("c", 0, checks=3))
    due = queue.due_checks(POLICY, 5000, {"b"})
    assert ids(due.check) == ["a"]
    assert ids(due.expire) == ["c"]


def test_a_transaction_with_its_own_check_after_goes_to_the_heap_and_keeps_its_time() -> None:
    late = open_tx("late", 0, check_after_s=60.0)
    queue, _ = queue_of(late, open_tx("soon", 0))
    assert queue.entries() == 2
    due = queue.due_checks(POLICY, 5000, set())
    assert ids(due.check) == ["soon"]
    # Its unscheduled entry (at its append time) came up: it got its real time, not a check.
    assert late.next_check_ms == 60_000
    assert late.dirty


def test_decided_transactions_are_skipped_and_compaction_drops_their_entries() -> None:
    queue, pending = queue_of(*(open_tx(f"t{n}", n, next_check_ms=6000 + n) for n in range(4)))
    for n in (1, 2):
        pending[f"t{n}"].move(Phase.ROLLED_BACK)
        del pending[f"t{n}"]
    assert queue.entries() == 4
    queue.compact()
    assert queue.entries() == 2
    scheduled = queue.scheduled_test()
    assert scheduled("t0", pending["t0"])
    assert scheduled("t3", pending["t3"])
    assert ids(queue.due_checks(POLICY, 10_000, set()).check) == ["t0", "t3"]


def test_the_queue_rebuilds_itself_once_stale_entries_exceed_the_slack() -> None:
    queue, pending = queue_of(slack=4)
    for n in range(100):
        tx = open_tx(f"t{n}", n)
        pending[tx.tx_id] = tx
        queue.add(tx, arriving=True)
        tx.move(Phase.ROLLED_BACK)
        del pending[tx.tx_id]
        assert queue.entries() <= 2 * 1 + 4  # one pending at most, and the slack
    assert queue.entries() < 100


def test_scheduled_test_and_stray_due_see_what_the_invariants_need() -> None:
    waiting, due_now = open_tx("waiting", 0, next_check_ms=50_000), open_tx("due", 0)
    queue, pending = queue_of(due_now)
    pending["waiting"] = waiting
    queue.add(waiting)
    lost = open_tx("lost", 0)  # pending but never queued: it would never be checked
    pending["lost"] = lost
    queue.due_checks(POLICY, 5000, set())
    scheduled = queue.scheduled_test()
    assert scheduled("waiting", waiting)
    assert scheduled("due", due_now)
    assert not scheduled("lost", lost)
    assert not queue.stray_due()
    del pending["due"]
    assert queue.stray_due()
