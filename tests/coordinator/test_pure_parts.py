"""Registry view, changelog entries and republish planning, without a broker."""

from __future__ import annotations

import pytest

from coordinator.checks.registry import RegistryView
from coordinator.commit.changelog import decode_entry, encode_entry
from coordinator.commit.payloads import evict
from coordinator.state.partition import HalfRef, PendingTx, Phase
from coordinator.state.republisher import copy_aside, plan_republish
from txbridge.errors import WireFormatError
from txbridge.wire import HalfMessage, OpSource, ProducerInstance, decode_half


def test_registry_prefers_the_writer_then_other_live_instances() -> None:
    view = RegistryView(liveness_s=10)
    for name, seen in (("a", 1_000), ("b", 5_000), ("c", 9_000)):
        view.apply(b"", ProducerInstance("orders", name, f"http://127.0.0.1/{name}").encode(), seen)
    assert view.targets("orders", "b", None, 12_000) == [
        "http://127.0.0.1/b",
        "http://127.0.0.1/c",
    ]  # a is stale
    view.apply(b"orders/b", None, 12_500)
    assert view.targets("orders", "b", None, 12_000) == ["http://127.0.0.1/c"]
    assert view.targets("payments", "b", None, 12_000) == []
    with pytest.raises(WireFormatError):
        view.apply(b"x", b"not json", 1)


def test_changelog_entry_round_trips_without_payloads() -> None:
    msg = HalfMessage("t", 0, "orders", b"v", key=b"k")
    tx = PendingTx(
        "t",
        2,
        Phase.COMMITTED,
        halves={0: HalfRef(7, 99, "orders", b"k", msg)},
        group="g",
        instance="i",
        first_append_ms=1000,
        check_after_s=1.5,
        decision_source=OpSource.CHECK,
        count=None,
        wait_offset=40,
        checks=3,
        next_check_ms=5000,
        decided_seq=12,
    )
    back = decode_entry(encode_entry(tx))
    assert back.halves[0] == HalfRef(7, 99, "orders", b"k", None)
    assert (back.phase, back.decision_source, back.wait_offset, back.checks, back.decided_seq) == (
        Phase.COMMITTED,
        OpSource.CHECK,
        40,
        3,
        12,
    )
    with pytest.raises(WireFormatError):
        decode_entry(b'{"v": 9}')


def test_plan_republish_keeps_seq_order_and_refuses_what_cannot_go() -> None:
    messages = [
        HalfMessage("t", 1, "b", b"2", key=b"k", user_headers=(("h", b"1"),)),
        HalfMessage("t", 0, "a", b"1", partition=1),
    ]
    plan = plan_republish(messages, 1000, lambda topic: 2)
    assert not isinstance(plan, str)
    assert [(r.topic, r.partition, r.headers) for r in plan] == [
        ("a", 1, [("txb.tx", b"t")]),
        ("b", None, [("h", b"1"), ("txb.tx", b"t")]),
    ]
    assert "above max_message_bytes" in str(plan_republish(messages, 10, lambda topic: 2))
    assert "does not exist" in str(plan_republish(messages, 1000, lambda topic: None))
    assert "no partition 1" in str(plan_republish(messages, 1000, lambda topic: 1))


def test_copies_aside_parse_back_as_halves_with_the_reason() -> None:
    msg = HalfMessage("t", 0, "orders", b"v", key=b"k", group="g", instance="i")
    record = copy_aside("ns_expired", msg, "no decision", "ns_half/0/5", checks=15)
    back = decode_half(record.value, record.headers)
    assert (back.tx_id, back.key, back.value) == ("t", b"k", b"v")
    assert dict(back.user_headers)["txb.checks"] == b"15"


def test_eviction_keeps_the_budget_and_the_offsets() -> None:
    txs = []
    for n in range(3):
        msg = HalfMessage(f"t{n}", 0, "o", b"x" * 100)
        txs.append(PendingTx(f"t{n}", 0, halves={0: HalfRef(n, 100, "o", None, msg)}, first_append_ms=n))
    assert evict(txs, 150) == 200
    assert [t.halves[0].message is None for t in txs] == [True, True, False]
    assert [t.halves[0].offset for t in txs] == [0, 1, 2]


def test_public_surface_is_pinned() -> None:
    import coordinator

    assert sorted(coordinator.__all__) == ["Coordinator", "CoordinatorConfig"]
