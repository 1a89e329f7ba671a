"""The internal topics of a namespace and their settings (``txbridge init``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from txbridge import kafka
from txbridge.client_config import ClientConfig
from txbridge.errors import KafkaOperationError
from txbridge.kafka import TopicSpec
from txbridge.wire import DEFAULT_NAMESPACE, DEFAULT_PARTITIONS, Topics

logger = logging.getLogger(__name__)

_DAY_MS = 24 * 3600 * 1000
#: segment.bytes of ``<ns>_state``. Each commit appends a positions record (and a commit marker)
#: to the ``<ns>_state`` partition of every partition it covers, and a takeover reads the
#: partition from its start; compaction drops superseded records from rolled segments only.
#: With Kafka's 1 GiB default the active segment holds millions of them after a day under load,
#: and the read grows with the coordinators' uptime (about 10 µs a record); 4 MiB bounds it
#: (docs/results/2026-11-28-state-segments.md).
STATE_SEGMENT_BYTES = 4 * 1024 * 1024
# Check timing uses the broker's append time, never the producer's clock (RocketMQ #9640).
_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def internal_topics(
    namespace: str = DEFAULT_NAMESPACE, partitions: int = DEFAULT_PARTITIONS, replication_factor: int = -1
) -> list[TopicSpec]:
    """Specs of every internal topic; half, op and state are co-partitioned (same count)."""
    names = Topics(namespace)
    rf = replication_factor

    def spec(name: str, parts: int, **config: str) -> TopicSpec:
        return TopicSpec(name, parts, config, rf)

    return [
        spec(
            names.half,
            partitions,
            **_APPEND_TIME,
            **{"cleanup.policy": "delete", "retention.ms": str(7 * _DAY_MS)},
        ),
        spec(
            names.op,
            partitions,
            **_APPEND_TIME,
            **{"cleanup.policy": "delete", "retention.ms": str(7 * _DAY_MS)},
        ),
        spec(
            names.state,
            partitions,
            **{
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                "segment.bytes": str(STATE_SEGMENT_BYTES),
            },
        ),
        spec(names.producers, 1, **_APPEND_TIME, **{"cleanup.policy": "compact"}),
        spec(names.expired, 1, **{"cleanup.policy": "delete", "retention.ms": str(30 * _DAY_MS)}),
        spec(names.quarantine, 1, **{"cleanup.policy": "delete", "retention.ms": str(30 * _DAY_MS)}),
    ]


def init_topics(
    bootstrap: str,
    namespace: str = DEFAULT_NAMESPACE,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int = -1,
    *,
    client_config: ClientConfig | Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Create the missing internal topics; give an existing ``<ns>_state`` the segments of
    :data:`STATE_SEGMENT_BYTES` (a namespace made by an older txbridge).

    Returns:
        ``{topic: "created" | "exists" | "updated"}``: updated, an existing ``<ns>_state``
        whose segment size was lowered. A broker that refuses the change leaves it as it was,
        with a warning that says what to set.

    Args:
        client_config: the client settings (security) of the cluster, as the SDK classes take them.
    """
    extra = ClientConfig.coerce(client_config).librdkafka()
    outcomes = kafka.ensure_topics(
        bootstrap, internal_topics(namespace, partitions, replication_factor), extra=extra
    )
    state = Topics(namespace).state
    if outcomes.get(state) == "exists":
        try:
            lowered = kafka.lower_topic_setting(
                bootstrap, [state], "segment.bytes", STATE_SEGMENT_BYTES, extra=extra
            )
        except KafkaOperationError as exc:
            logger.warning(
                "%s keeps its segment size (%s): a takeover's restore reads more of it the longer the "
                "coordinators run; set segment.bytes=%d on it (kafka-configs.sh --alter --entity-type "
                "topics --entity-name %s --add-config segment.bytes=%d)",
                state,
                exc,
                STATE_SEGMENT_BYTES,
                state,
                STATE_SEGMENT_BYTES,
            )
        else:
            if lowered:
                outcomes[state] = "updated"
    return outcomes
