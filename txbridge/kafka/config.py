"""The librdkafka settings of txbridge's clients: pure dictionaries, no client is made here.

Which defaults each kind of client starts from (:func:`producer_config`), how a user's settings
go on top (:func:`client_config`), and which part of one mixed set a client of a given role
takes (:func:`settings_for`). :mod:`txbridge.client_config` parses what users write
(``--command-config``, ``-X``, Java names) into these settings; the clients themselves are made
by :mod:`txbridge.kafka.clients` and :mod:`txbridge.kafka.admin`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from txbridge.errors import ConfigurationError

__all__ = [
    "CONSUMER_ONLY",
    "PARTITIONER",
    "PRODUCER_ONLY",
    "TRANSACTIONAL_RETRY_BACKOFF_MS",
    "Config",
    "Role",
    "client_config",
    "consumer_config",
    "producer_config",
    "settings_for",
]

_librdkafka_logger = logging.getLogger("txbridge.librdkafka")

Config = dict[str, Any]


def client_config(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Config:
    """librdkafka settings: ``defaults`` first, then the user's ``extra`` on top.

    librdkafka's own log lines go to the ``txbridge.librdkafka`` logger.
    """
    if not bootstrap:
        raise ConfigurationError(
            "no Kafka bootstrap address: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS"
        )
    config: Config = {"bootstrap.servers": bootstrap, "logger": _librdkafka_logger}
    config.update({k.replace("_", "."): v for k, v in defaults.items()})
    config.update(extra or {})
    return config


#: A client's role: which librdkafka settings of a mixed set it takes (:func:`settings_for`).
Role = Literal["producer", "consumer", "admin"]

#: Settings only a producer takes (names or name prefixes); other clients warn about them, and
#: reject ``on_delivery``.
PRODUCER_ONLY = (
    "linger.ms",
    "acks",
    "enable.idempotence",
    "message.timeout.ms",
    "delivery.",
    "batch.",
    "compression.",
    "queue.buffering",
    "partitioner",
    "sticky.partitioning",
    "transactional.id",
    "transaction.timeout.ms",
    "on_delivery",
)
#: Settings only a consumer takes (names or name prefixes): group tuning, offsets, isolation,
#: fetches; other clients warn about them, and reject ``on_commit``.
CONSUMER_ONLY = (
    "group.",
    "session.",
    "heartbeat.",
    "max.poll.",
    "auto.",
    "isolation.",
    "enable.auto",
    "enable.partition.eof",
    "fetch.",
    "partition.assignment.strategy",
    "on_commit",
)
_DROPPED: dict[Role, tuple[str, ...]] = {
    "producer": CONSUMER_ONLY,
    "consumer": PRODUCER_ONLY,
    "admin": PRODUCER_ONLY + CONSUMER_ONLY,
}


def settings_for(role: Role, settings: Mapping[str, Any]) -> Config:
    """The part of ``settings`` (librdkafka names) that a client of ``role`` takes.

    One set of client settings serves several clients (a consumer's extra config also
    makes its dead-letter producer and its admin client): a producer drops the
    consumer-only settings, a consumer the producer-only ones, an admin client both.
    The rest (connection, security, logging) goes to every client.
    """
    return {k: v for k, v in settings.items() if not k.startswith(_DROPPED[role])}


#: retry.backoff.ms of transactional producers. A transaction that starts while the broker
#: still writes the previous one's markers gets CONCURRENT_TRANSACTIONS; librdkafka retries
#: after retry.backoff.ms, 100 ms by default, which under load adds a whole retry to many
#: transactions' commit-to-visible (docs/results/settings.md).
TRANSACTIONAL_RETRY_BACKOFF_MS = 10

#: partitioner of every producer: murmur2 of the key, the partition Kafka's Java producer picks, so
#: txbridge and Java clients agree on where a key lives (librdkafka's default, consistent_random,
#: hashes with CRC32: on 12 partitions most keys land elsewhere). Null keys are spread, sticky for
#: sticky.partitioning.linger.ms as Java's are; an explicit partition is kept. ``extra`` may override.
PARTITIONER = "murmur2_random"


def producer_config(bootstrap: str, extra: Mapping[str, Any] | None = None, **defaults: Any) -> Config:
    """The settings of :func:`~txbridge.kafka.producer`; a transactional one retries after 10 ms,
    not 100 ms."""
    base: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
    base["partitioner"] = PARTITIONER  # keys where Java's producer puts them
    if "transactional_id" in defaults:
        base["retry.backoff.ms"] = TRANSACTIONAL_RETRY_BACKOFF_MS
    base.update({k.replace("_", "."): v for k, v in defaults.items()})
    return client_config(bootstrap, extra, **base)


def consumer_config(
    bootstrap: str, group: str, extra: Mapping[str, Any] | None = None, **defaults: Any
) -> Config:
    """The settings of :func:`~txbridge.kafka.consumer`: read_committed, manual offset commits,
    from the earliest offset, unless ``defaults``/``extra`` say otherwise."""
    base = {
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    base.update({k.replace("_", "."): v for k, v in defaults.items()})
    return client_config(bootstrap, extra, **base)
