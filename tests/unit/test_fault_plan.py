"""The demo's fault plan and percentile: pure logic, no broker."""

from __future__ import annotations

import pytest

from spark_pipelines.faults import Fault, FaultPlan, FaultRates
from spark_pipelines.percentiles import percentile
from spark_pipelines.schema import OrderCreated, decode, encode


def test_same_seed_same_plan_and_a_different_seed_differs() -> None:
    a = FaultPlan.generate(5, 300)
    b = FaultPlan.generate(5, 300)
    c = FaultPlan.generate(6, 300)

    assert a == b
    assert a.orders != c.orders


def test_plan_survives_json() -> None:
    plan = FaultPlan.generate(9, 50, every_fault=True)

    assert FaultPlan.from_json(plan.to_json()) == plan


def test_every_fault_places_each_kind_at_least_once_even_at_zero_rates() -> None:
    zero = FaultRates(0, 0, 0, 0)

    plan = FaultPlan.generate(1, 40, rates=zero, every_fault=True)

    assert {o.fault for o in plan.orders} == set(Fault)
    assert all(plan.count(kind) == 1 for kind in Fault if kind is not Fault.NONE)
    # Faults start after the first tenth, so every path has a clean warm-up.
    assert all(o.fault is Fault.NONE for o in plan.orders[:4])


def test_customer_sequences_count_up_per_customer() -> None:
    plan = FaultPlan.generate(3, 200, customers=7)
    last: dict[str, int] = {}

    for order in plan.orders:
        assert order.customer_seq == last.get(order.customer_id, 0) + 1
        last[order.customer_id] = order.customer_seq

    assert len(last) == 7
    assert len({o.order_id for o in plan.orders}) == 200


def test_rates_are_validated() -> None:
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultRates(0.6, 0.6, 0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        FaultRates(-0.1, 0, 0, 0)


def test_coordinator_is_killed_mid_run_unless_disabled() -> None:
    assert FaultPlan.generate(1, 100).coordinator_kill_after == 50
    assert FaultPlan.generate(1, 100, kill_coordinator=False).coordinator_kill_after is None


def test_nearest_rankpercentile() -> None:
    values = list(range(1, 101))

    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_avro_round_trip_and_foreign_bytes() -> None:
    event = OrderCreated("o-1", "customer-001", 3, 1234, 99)

    assert decode(encode(event)) == event
    with pytest.raises(ValueError, match="not an OrderCreated"):
        decode(b"\x80")
