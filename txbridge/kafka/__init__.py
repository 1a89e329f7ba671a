"""txbridge's Kafka boundary: the one package that imports confluent_kafka.

Everything above it (producer semantics, consumers, the coordinator, the tools, the pipelines,
the examples) goes through these names, so client defaults, error translation and librdkafka
logging are decided in one place, and ``ruff`` (TID251) and ``lint-imports`` (a protected
contract) refuse ``confluent_kafka`` anywhere else but the tests. By responsibility:

- :mod:`~txbridge.kafka.config`: the librdkafka settings of each kind of client, pure
  dictionaries (:func:`producer_config`, :func:`settings_for`);
- :mod:`~txbridge.kafka.clients`: the client factories (:func:`producer`, :func:`consumer`),
  reading partitions to their end (:func:`read_to_end`), committing offsets, and whether
  librdkafka takes a set of settings (:func:`librdkafka_refusal`);
- :mod:`~txbridge.kafka.errors`: confluent_kafka's errors classified into txbridge's tree
  (:func:`to_error`);
- :mod:`~txbridge.kafka.admin`: the admin client, topics (:func:`ensure_topics`), the brokers'
  reachability (:func:`check_reachable`).

Clients and their types are confluent_kafka's own classes, re-exported here (``Producer``,
``Consumer``, ``TopicPartition``, ``Message``, ``KafkaError``, ``KafkaException``,
``AdminClient``, ``NewTopic``, ...): a typed seam, not a wrapper. Public inside the project
and to tools built on it; the SDK's API stays ``txbridge.__all__``.
"""

from __future__ import annotations

from txbridge.kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ElectionType,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    TopicSpec,
    admin,
    broker_count,
    check_reachable,
    delete_topics_with_prefix,
    ensure_topics,
    group_protocols,
    groups_consuming,
    lower_topic_setting,
    offset_bounds,
    partition_counts,
    set_cluster_setting,
    stable_offsets,
)
from txbridge.kafka.clients import (
    FROM_START,
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    Headers,
    Message,
    Producer,
    TopicPartition,
    append_time_ms,
    commit_offsets,
    consume_available,
    consumer,
    init_transactions,
    librdkafka_refusal,
    opened,
    partition_at,
    producer,
    read_to_end,
    seek_started,
    topic_partitions,
    versions,
)
from txbridge.kafka.config import (
    CONSUMER_ONLY,
    PARTITIONER,
    PRODUCER_ONLY,
    TRANSACTIONAL_RETRY_BACKOFF_MS,
    Config,
    Role,
    client_config,
    consumer_config,
    producer_config,
    settings_for,
)
from txbridge.kafka.errors import (
    KafkaError,
    KafkaException,
    is_partition_eof,
    is_unknown_partition,
    is_unreleased_instance,
    is_unsupported,
    to_error,
)

__all__ = [
    "CONSUMER_ONLY",
    "FROM_START",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "PARTITIONER",
    "PRODUCER_ONLY",
    "TRANSACTIONAL_RETRY_BACKOFF_MS",
    "AclBinding",
    "AclOperation",
    "AclPermissionType",
    "AdminClient",
    "Config",
    "Consumer",
    "ElectionType",
    "Headers",
    "KafkaError",
    "KafkaException",
    "Message",
    "NewTopic",
    "Producer",
    "ResourcePatternType",
    "ResourceType",
    "Role",
    "TopicPartition",
    "TopicSpec",
    "admin",
    "append_time_ms",
    "broker_count",
    "check_reachable",
    "client_config",
    "commit_offsets",
    "consume_available",
    "consumer",
    "consumer_config",
    "delete_topics_with_prefix",
    "ensure_topics",
    "group_protocols",
    "groups_consuming",
    "init_transactions",
    "is_partition_eof",
    "is_unknown_partition",
    "is_unreleased_instance",
    "is_unsupported",
    "librdkafka_refusal",
    "lower_topic_setting",
    "offset_bounds",
    "opened",
    "partition_at",
    "partition_counts",
    "producer",
    "producer_config",
    "read_to_end",
    "seek_started",
    "set_cluster_setting",
    "settings_for",
    "stable_offsets",
    "to_error",
    "topic_partitions",
    "versions",
]
