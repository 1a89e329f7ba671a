"""The txbridge coordinator: republishes committed half messages inside Kafka transactions.

Its packages are its parts (docs/DESIGN.md, "The coordinator's parts"):

- :mod:`coordinator.state`: the owned partitions' state, pure logic: the per-partition
  pending-transaction state machine and its indexes, back-check timing, the records the next
  commits carry, and their one owner (:class:`coordinator.state.owned.OwnedPartitions`);
- :mod:`coordinator.checks`: back-checks over signed HTTP, the producer registry, the brokers'
  clock, expired transactions resumed;
- :mod:`coordinator.commit`: one Kafka transaction per owned partition, what it carries, group
  commit on the commit threads;
- :mod:`coordinator.group`: the consumer group: joining, rebalancing, restoring a taken-over
  partition, hand-over, health;
- :mod:`coordinator.monitoring`: counters and gauges; the watchdog over blocking Kafka calls;
- :mod:`coordinator.config`: the frozen settings (flags, ``TXBRIDGE_*`` env, TOML);
- :mod:`coordinator.assembly`: :func:`~coordinator.assembly.build` makes the parts, in
  dependency order;
- :mod:`coordinator.service`: the loop that runs them; :mod:`coordinator.cli`: the command.

:class:`Coordinator` loads on first use, so that :mod:`coordinator.cli` (which the ``txbridge``
command registers) imports without the ``coordinator`` extra: the command then says what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordinator.config import CoordinatorConfig

if TYPE_CHECKING:
    from coordinator.service import Coordinator

__all__ = ["Coordinator", "CoordinatorConfig"]


def __getattr__(name: str) -> Any:
    if name != "Coordinator":
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    from coordinator.service import Coordinator

    globals()[name] = Coordinator  # later lookups skip this function
    return Coordinator
