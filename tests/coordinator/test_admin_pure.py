"""The admin's pure parts: markers, fencing ids, and which quarantined transactions may be requeued."""

from __future__ import annotations

from coordinator.state.republisher import copy_aside, plan_republish
from txbridge.admin._once import H_ADMIN, REQUEUE, RESOLVE, Marker, decode_marker, fence_id
from txbridge.admin._quarantine import Quarantined
from txbridge.wire import HalfMessage, TxState


def _message(seq: int = 0, size: int = 3) -> HalfMessage:
    return HalfMessage("tx-1", seq, "orders", b"x" * size, key=b"k", partition=5, group="g", instance="i")


def test_a_marker_reads_back_as_written() -> None:
    marker = Marker("tx-1", REQUEUE, TxState.COMMIT, "attempt-1", new_tx_id="tx-2", timestamp_ms=7)
    key, value, headers = marker.record()
    assert key == b"tx-1"
    assert headers == [(H_ADMIN, b"requeue")]
    assert decode_marker(headers, value) == marker
    assert marker.describe() == "requeued as tx-2"
    assert Marker("tx-1", RESOLVE, TxState.ROLLBACK, "a").describe() == "resolved ROLLBACK"


def test_copies_and_strangers_are_not_markers() -> None:
    _key, value, headers = Marker("tx-1", RESOLVE, TxState.COMMIT, "a").record()
    copy = copy_aside("q", _message(), "why", "h/0/1")
    assert decode_marker(copy.headers, copy.value) is None
    # A raw record copied aside keeps the producer's headers, whatever they are, plus txb.origin.
    assert decode_marker([*headers, ("txb.origin", b"h/0/1")], value) is None
    assert decode_marker(headers, b"{not json") is None
    assert (
        decode_marker(headers, b'{"v":2,"tx":"t","action":"resolve","state":"COMMIT","attempt":"a"}') is None
    )
    assert decode_marker([], value) is None


def test_fence_ids_are_per_transaction_and_bounded() -> None:
    assert fence_id("ns", "tx-1") == "ns-admin-tx-1"
    assert fence_id("ns", "tx-1") != fence_id("ns", "tx-2")
    assert fence_id("ns", "tx-1") != fence_id("other", "tx-1")
    long_a, long_b = fence_id("ns", "a" * 500), fence_id("ns", "a" * 499 + "b")
    assert len(long_a) <= 200
    assert long_a != long_b


def _quarantined(reason: str, seqs: tuple[int, ...] = (0, 1)) -> Quarantined:
    return Quarantined("tx-1", reason=reason, messages=[_message(s) for s in seqs])


def test_the_coordinators_curable_reasons_are_requeueable() -> None:
    too_big = plan_republish([_message(size=500)], 100, lambda _topic: 6)
    missing = plan_republish([_message()], 1000, lambda _topic: None)
    no_partition = plan_republish([_message()], 1000, lambda _topic: 2)
    reasons = [
        too_big,
        missing,
        no_partition,
        "the broker rejected a message to orders: Broker: Message size",
    ]
    for reason in reasons:
        assert isinstance(reason, str)
        assert _quarantined(reason).not_requeueable() is None, reason


def test_a_partial_or_raw_or_requeued_entry_is_not_requeueable() -> None:
    missing = "topic 'orders' does not exist"
    assert "does not go away" in str(_quarantined("incomplete: 1 of 2 half records found").not_requeueable())
    assert "does not go away" in str(_quarantined("1 half record(s) can no longer be read").not_requeueable())
    assert "incomplete" in str(_quarantined(missing, seqs=(1, 2)).not_requeueable())
    assert "not a transaction" in str(Quarantined("k", raw=True, reason=missing).not_requeueable())
    done = _quarantined(missing)
    done.requeued = Marker("tx-1", REQUEUE, TxState.COMMIT, "a", new_tx_id="tx-2")
    assert done.not_requeueable() == "already requeued as tx-2"
    assert done.status() == "requeued as tx-2"
