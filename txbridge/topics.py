"""The internal topics of a namespace and their settings (``txbridge init``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txbridge import kafka
from txbridge.client_config import ClientConfig
from txbridge.kafka import TopicSpec
from txbridge.wire import DEFAULT_NAMESPACE, DEFAULT_PARTITIONS, Topics

_DAY_MS = 24 * 3600 * 1000
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
        spec(names.state, partitions, **{"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}),
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
    """Create the missing internal topics. Returns ``{topic: "created" | "exists"}``.

    Args:
        client_config: the client settings (security) of the cluster, as the SDK classes take them.
    """
    extra = ClientConfig.coerce(client_config).librdkafka()
    return kafka.ensure_topics(
        bootstrap, internal_topics(namespace, partitions, replication_factor), extra=extra
    )
