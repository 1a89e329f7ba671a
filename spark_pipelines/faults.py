"""The fault plan: the same orders and the same faults for every path, from a seed.

A plan is pure data (no I/O): the orders in the sequence the order service
handles them, each with at most one fault, plus the order after which the
txbridge coordinator is killed and restarted. ``FaultPlan.generate`` with the
same arguments always gives the same plan.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Fault(StrEnum):
    """What goes wrong while the order service handles one order.

    ``CRASH_*`` faults are real SIGKILLs of the producer process at that step;
    the runner starts a fresh process for the remaining orders.
    """

    NONE = "none"
    LOCAL_FAIL = "local_fail"  # the local DB transaction fails and rolls back
    UNKNOWN = "unknown"  # the DB commits but the producer never learns the outcome
    CRASH_AFTER_BEGIN = "crash_after_begin"  # killed after half/begin, before the DB commit
    CRASH_AFTER_DB_COMMIT = "crash_after_db_commit"  # killed between the DB commit and the Kafka commit/op


CRASHES = frozenset({Fault.CRASH_AFTER_BEGIN, Fault.CRASH_AFTER_DB_COMMIT})


@dataclass(frozen=True)
class FaultRates:
    """Probability of each fault per order (the rest run cleanly)."""

    local_fail: float = 0.05
    unknown: float = 0.03
    crash_after_begin: float = 0.01
    crash_after_db_commit: float = 0.01

    def __post_init__(self) -> None:
        rates = self.as_dict().values()
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1, got {self.as_dict()}")

    def as_dict(self) -> dict[Fault, float]:
        return {
            Fault.LOCAL_FAIL: self.local_fail,
            Fault.UNKNOWN: self.unknown,
            Fault.CRASH_AFTER_BEGIN: self.crash_after_begin,
            Fault.CRASH_AFTER_DB_COMMIT: self.crash_after_db_commit,
        }


@dataclass(frozen=True)
class PlannedOrder:
    """One order of the plan."""

    index: int
    order_id: str
    customer_id: str
    customer_seq: int
    amount_cents: int
    fault: Fault = Fault.NONE


@dataclass(frozen=True)
class FaultPlan:
    """The orders, their faults and when the coordinator is killed."""

    seed: int
    orders: tuple[PlannedOrder, ...]
    coordinator_kill_after: int | None = None  # order index; None = never
    rates: dict[str, float] = field(default_factory=dict)

    @classmethod
    def generate(
        cls,
        seed: int,
        orders: int,
        *,
        customers: int = 20,
        rates: FaultRates | None = None,
        every_fault: bool = False,
        kill_coordinator: bool = True,
    ) -> FaultPlan:
        """A reproducible plan.

        Args:
            seed: the random seed; the same arguments give the same plan.
            orders: how many orders.
            customers: how many distinct customers (keys).
            rates: per-order fault probabilities.
            every_fault: place each fault kind at least once (needs ``orders >= 10``).
            kill_coordinator: kill the coordinator once, mid-run.
        """
        if orders <= 0 or customers <= 0:
            raise ValueError("orders and customers must be positive")
        rates = rates or FaultRates()
        rng = random.Random(seed)
        kinds = list(rates.as_dict().items())
        faults: list[Fault] = []
        for _ in range(orders):
            draw, fault = rng.random(), Fault.NONE
            for kind, rate in kinds:
                if draw < rate:
                    fault = kind
                    break
                draw -= rate
            faults.append(fault)
        if every_fault:
            if orders < 10:
                raise ValueError("every_fault needs at least 10 orders")
            missing = [kind for kind, _ in kinds if kind not in faults]
            clean = [i for i in range(orders // 10, orders) if faults[i] is Fault.NONE]
            for kind, i in zip(missing, rng.sample(clean, len(missing)), strict=True):
                faults[i] = kind
        seqs: dict[str, int] = {}
        planned = []
        for i, fault in enumerate(faults):
            customer = f"customer-{rng.randrange(customers):03d}"
            seqs[customer] = seqs.get(customer, 0) + 1
            planned.append(
                PlannedOrder(
                    index=i,
                    order_id=f"o-{seed}-{i:06d}",
                    customer_id=customer,
                    customer_seq=seqs[customer],
                    amount_cents=rng.randrange(100, 100_000),
                    fault=fault,
                )
            )
        kill = orders // 2 if kill_coordinator and orders > 1 else None
        return cls(seed, tuple(planned), kill, {k.value: v for k, v in rates.as_dict().items()})

    def count(self, fault: Fault) -> int:
        return sum(1 for o in self.orders if o.fault is fault)

    def to_json(self) -> str:
        body: dict[str, Any] = asdict(self)
        return json.dumps(body)

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        body = json.loads(text)
        orders = tuple(PlannedOrder(**{**o, "fault": Fault(o["fault"])}) for o in body["orders"])
        return cls(body["seed"], orders, body["coordinator_kill_after"], body["rates"])
