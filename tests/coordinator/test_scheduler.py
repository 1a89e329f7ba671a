"""Back-check timing: broker append time + the coordinator's clock, growing capped backoff."""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.state import scheduler
from coordinator.state.partition import Due, PendingTx, Phase
from coordinator.state.scheduler import CheckPolicy

POLICY = CheckPolicy(delay_s=6.0, max_checks=3, backoff_s=5.0, backoff_max_s=12.0)


def scan_due(policy: CheckPolicy, txs: Iterable[PendingTx], now_ms: int, in_flight: set[str]) -> Due:
    """Undecided transactions whose check time has come (``in_flight`` ones are skipped), by a
    scan: :meth:`PartitionState.due_checks` gives the same answer from its indexes."""
    check: list[PendingTx] = []
    expire: list[PendingTx] = []
    for tx in txs:
        if tx.phase is not Phase.OPEN or tx.tx_id in in_flight:
            continue
        if tx.next_check_ms is None:
            tx.next_check_ms = policy.first_due_ms(tx, now_ms)
            tx.dirty = True
        if tx.next_check_ms > now_ms:
            continue
        (expire if policy.exhausted(tx, now_ms) else check).append(tx)
    return Due(check, expire)


def open_tx(append_ms: int = 100_000, check_after: float | None = None) -> PendingTx:
    return PendingTx("t", 0, first_append_ms=append_ms, check_after_s=check_after)


def test_first_check_counts_from_the_broker_append_time() -> None:
    tx = open_tx()
    assert scan_due(POLICY, [tx], 105_999, set()).check == []
    assert scan_due(POLICY, [tx], 106_000, set()).check == [tx]


def test_per_message_check_after_overrides_the_delay() -> None:
    tx = open_tx(check_after=1.5)
    assert scan_due(POLICY, [tx], 101_500, set()).check == [tx]


def test_backoff_grows_and_is_capped() -> None:
    assert [POLICY.backoff_ms(n) for n in (1, 2, 3, 4)] == [5_000, 10_000, 12_000, 12_000]


def test_unknown_reschedules_then_expires_after_max_checks() -> None:
    tx = open_tx()
    assert not scheduler.record_unknown(POLICY, tx, 200_000)
    assert tx.next_check_ms == 205_000
    assert scan_due(POLICY, [tx], 204_999, set()).check == []
    assert not scheduler.record_unknown(POLICY, tx, 205_000)
    assert scheduler.record_unknown(POLICY, tx, 215_000)
    assert scan_due(POLICY, [tx], 215_000, set()).expire == [tx]


def test_a_transaction_nobody_could_be_asked_about_is_tried_again_soon_then_less_often() -> None:
    """A restarting group (URLs refusing, the replacement not registered yet) is back within
    seconds: retries start at 0.5 s and grow to ``backoff_s``, and never use up ``max_checks``."""
    tx = open_tx()
    now, waits = 106_000, []
    for _ in range(8):
        assert not scheduler.record_not_asked(POLICY, tx, now, "connection refused")
        assert tx.next_check_ms is not None
        waits.append(tx.next_check_ms - now)
        now = tx.next_check_ms
    assert waits == [500, 500, 1_000, 2_000, 4_000, 5_000, 5_000, 5_000]
    assert tx.checks == 0
    assert tx.problem == "connection refused"
    scheduler.record_unknown(POLICY, tx, now)  # an answer ends the unasked spell
    assert tx.unasked_since_ms is None
    assert tx.next_check_ms == now + 5_000


def test_unasked_for_max_unasked_s_expires() -> None:
    policy = CheckPolicy(max_unasked_s=3.0)
    tx = open_tx()
    assert not scheduler.record_not_asked(policy, tx, 106_000, "no live instance")
    assert scheduler.record_not_asked(policy, tx, 109_000, "no live instance")
    assert tx.next_check_ms == 109_000


def test_in_flight_and_decided_transactions_are_not_checked() -> None:
    waiting, decided = open_tx(), PendingTx("d", 0, phase=Phase.COMMITTED, first_append_ms=0)
    due = scan_due(POLICY, [waiting, decided], 10**9, {"t"})
    assert (due.check, due.expire) == ([], [])
