"""The txbridge coordinator: republishes committed half messages inside Kafka transactions.

Small collaborators, pure logic apart from I/O:

- :mod:`coordinator.config`: the frozen settings (flags, ``TXBRIDGE_*`` env, TOML);
- :mod:`coordinator.state`: the per-partition pending-transaction state machine;
  its parts :mod:`coordinator.check_queue`, :mod:`coordinator.key_order`, :mod:`coordinator.resolved`,
  :mod:`coordinator.commit_order` and :mod:`coordinator.unsaved`;
- :mod:`coordinator.scheduler`: back-check timing and backoff;
- :mod:`coordinator.checker`: signed HTTP back-checks with per-group concurrency;
- :mod:`coordinator.registry`: live producer instances from ``<ns>_producers``;
- :mod:`coordinator.changelog`: ``<ns>_state`` entries and their restore;
- :mod:`coordinator.republisher`: the records (republished, set aside, op records);
- :mod:`coordinator.commit`: what one Kafka transaction carries, in order;
- :mod:`coordinator.writer`: the transactional producer (refusals, delivery failures);
- :mod:`coordinator.payloads`: the payload byte budget and re-reads by offset;
- :mod:`coordinator.metrics`: Prometheus counters and gauges;
- :mod:`coordinator.commit_cycle`: group commit, the commit threads, rewinding a failed commit;
- :mod:`coordinator.rebalance`: taking partitions over, keeping them, letting them go;
- :mod:`coordinator.clients`: the group's consumer, rejoining with new clients;
- :mod:`coordinator.shared`: what those parts share, handed to each by the service;
- :mod:`coordinator.service`: the loop that ties them together.

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
