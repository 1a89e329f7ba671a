"""The txbridge coordinator: republishes committed half messages inside Kafka transactions.

Small collaborators, pure logic apart from I/O:

- :mod:`coordinator.config`: the frozen settings (flags, ``TXBRIDGE_*`` env, TOML);
- :mod:`coordinator.state`: the per-partition pending-transaction state machine;
- :mod:`coordinator.scheduler`: back-check timing and backoff;
- :mod:`coordinator.checker`: signed HTTP back-checks with per-group concurrency;
- :mod:`coordinator.registry`: live producer instances from ``<ns>_producers``;
- :mod:`coordinator.changelog`: ``<ns>_state`` entries and their restore;
- :mod:`coordinator.republisher`: the records (republished, set aside, op records);
- :mod:`coordinator.commit`: what one Kafka transaction carries, in order;
- :mod:`coordinator.writer`: the transactional producer (refusals, delivery failures);
- :mod:`coordinator.payloads`: the payload byte budget and re-reads by offset;
- :mod:`coordinator.metrics`: Prometheus counters and gauges;
- :mod:`coordinator.service`: the loop that ties them together.
"""

from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator

__all__ = ["Coordinator", "CoordinatorConfig"]
