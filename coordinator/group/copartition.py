"""The start-up check that ``<ns>_half``, ``<ns>_op`` and ``<ns>_state`` are co-partitioned.

Partition p of the three topics is one unit: a transaction's halves and its decision go to
the same p (:func:`txbridge.wire.half_partition` over the producer's partition count); the
group's ``range`` assignment gives half p and op p to one member; and p's pending transactions
and positions are kept in ``<ns>_state`` p. A topic with another partition count breaks that
silently: decisions land where nobody waits for them, or a partition's state is written where
no owner reads it. So a coordinator refuses to start.
"""

from __future__ import annotations

import logging

from coordinator.config import CoordinatorConfig
from txbridge import kafka
from txbridge.errors import ConfigurationError, KafkaOperationError
from txbridge.wire import Topics

logger = logging.getLogger(__name__)


def check_copartitioned(config: CoordinatorConfig, topics: Topics) -> None:
    """Refuse to start unless the half, op and state topics have one partition count.

    A topic that does not exist yet is not compared (the coordinator waits for it as before),
    and when no broker answers the check is skipped with a warning: a coordinator started during
    an outage waits for the brokers, as it always did, rather than exit.

    Raises:
        ConfigurationError: their partition counts differ; the message names them and what to do.
    """
    names = (topics.half, topics.op, topics.state)
    try:
        counts = kafka.partition_counts(config.bootstrap, names, extra=config.extra_config)
    except KafkaOperationError as exc:
        logger.warning("the partition counts of %s are not compared: %s", ", ".join(names), exc)
        return
    existing = {name: count for name, count in counts.items() if count is not None}
    missing = sorted(set(names) - set(existing))
    if missing:
        logger.warning("topics %s do not exist yet: create them with `txbridge init`", ", ".join(missing))
    if len(set(existing.values())) <= 1:
        return
    most = max(existing.values())
    listed = ", ".join(f"{name} has {count}" for name, count in existing.items())
    raise ConfigurationError(
        f"the topics of namespace {config.namespace!r} are not co-partitioned: {listed} partitions. "
        f"Partition p of each must hold the same transactions; the coordinator does not start. "
        f"Raise the others to {most} partitions (kafka-topics --alter --partitions {most}) while no "
        "producer writes and nothing is pending, and restart the producers with the same count; "
        "or recreate the namespace (`txbridge init --partitions N` on a new namespace)"
    )
