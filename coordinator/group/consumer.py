"""The group's half/op consumer: its settings (protocol, session, fetches) and how it is made.

:class:`GroupConsumers` makes each consumer the coordinator joins the group with
(:class:`coordinator.group.clients.GroupClients`); the group session timeout follows the cluster's size,
asked once.
"""

from __future__ import annotations

import logging
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.restore import RESTORE_WAIT_S
from txbridge import kafka
from txbridge.kafka import Consumer, KafkaException

logger = logging.getLogger(__name__)

#: The half/op consumer's fetches follow the load. The broker holds a fetch until the first
#: record (``fetch.min.bytes`` 1) and answers it as soon as one is appended, or after
#: FETCH_WAIT_MS when none is: the wait delays no record, it only sets how often an idle
#: coordinator asks each broker it reads from. At 5 ms that was 200 times a second, and an
#: idle coordinator cost the secured cluster's brokers about half a core between them; at
#: 100 ms it is ten, within the brokers' own idle noise, and the op record's trip to the loop
#: measured the same (docs/capacity.md, "What an idle coordinator costs the broker"). What the
#: wait can delay is a partition that starts fetching while a fetch to its broker is out
#: (librdkafka keeps one per broker): one resumed after its restore, beside partitions this
#: coordinator already fetches, waits at most FETCH_WAIT_MS. And while the loop has not yet
#: taken what the last fetch brought (QUEUED_MIN_MESSAGES or more records waiting), librdkafka
#: fetches again only after FETCH_QUEUE_BACKOFF_MS: under load fetches come every
#: FETCH_QUEUE_BACKOFF_MS with whatever accumulated, which keeps the throughput of batched
#: fetches (``fetch.min.bytes`` 1 alone costs throughput; the measurements:
#: docs/results/settings.md).
#: ``extra_config`` overrides all three.
FETCH_WAIT_MS = 100
FETCH_MIN_BYTES = 1
QUEUED_MIN_MESSAGES = 2
FETCH_QUEUE_BACKOFF_MS = 5


def fetch_settings() -> dict[str, int]:
    """The half/op consumer's fetch settings, as ``kafka.consumer`` keywords (the floor's too)."""
    return {
        "fetch_wait_max_ms": FETCH_WAIT_MS,
        "fetch_min_bytes": FETCH_MIN_BYTES,
        "queued_min_messages": QUEUED_MIN_MESSAGES,
        "fetch_queue_backoff_ms": FETCH_QUEUE_BACKOFF_MS,
    }


#: A crashed instance's partitions move after the group session timeout. On one broker it is
#: the least a broker allows by default (group.min.session.timeout.ms = 6000).
SESSION_TIMEOUT_MS = 6_000
#: On a cluster, Kafka's group coordinator (4.x) answers a heartbeat only once the writes it
#: queued before it on the group's ``__consumer_offsets`` partition are replicated, and a dead
#: follower holds them until the controller fences its node (``broker.session.timeout.ms``,
#: 9 s by default). A shorter session is lost at every node death: the members drop their
#: partitions, join again and restore, seconds after the partitions have leaders again. So on
#: more than one broker the session outlasts that window (docs/coordinator.md, "Failover").
REPLICATED_SESSION_TIMEOUT_MS = 12_000
#: A survivor hears of a dead member's expired session only in its next heartbeat's answer, so
#: a takeover takes (session timeout - time since the dead one's last heartbeat) + up to one
#: interval: with the 6 s session, 4-8 s at a 2 s interval, 5.5-6.5 s at 0.5 s. The members of
#: one rebalance heartbeat in step, so a kill at a fixed moment after a rebalance always lands
#: at the same point of their cycle (the measurements: docs/results/settings.md).
HEARTBEAT_INTERVAL_MS = 500
#: The consumer may sit in one rebalance callback for as long (librdkafka otherwise leaves the
#: group when poll() is not called for max.poll.interval.ms, 5 minutes by default).
_MAX_POLL_INTERVAL_MS = int((RESTORE_WAIT_S + 60) * 1000)


class GroupConsumers:
    """Makes the group's half/op consumers.

    Args:
        config: the coordinator's settings.
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self._session_ms: int | None = None  # asked of the cluster on first use

    def new(self) -> Consumer:
        """The group's half/op consumer, not yet subscribed."""
        cfg = self.config
        # Partition i of half and op on one member (DESIGN pitfalls): the classic protocol with the
        # client-side range assignor, or the consumer protocol with the broker's range assignor,
        # which gives topics of equal partition counts the same numbers (and keeps them sticky).
        # Under the consumer protocol the session and the heartbeat are the group's settings,
        # the broker's (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms).
        protocol: dict[str, Any] = (
            {"group_protocol": "consumer", "group_remote_assignor": "range"}
            if cfg.group_protocol == "consumer"
            else {
                "group_protocol": "classic",
                "partition_assignment_strategy": "range",
                # Failover speed: a crashed instance's partitions move after this (extra_config overrides).
                "session_timeout_ms": self.session_timeout_ms(),
                "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            }
        )
        return kafka.consumer(
            cfg.bootstrap,
            cfg.group_id,
            cfg.extra_config,
            **protocol,
            client_id=cfg.instance_id,
            max_poll_interval_ms=_MAX_POLL_INTERVAL_MS,  # an assignment may wait out a foreign transaction
            **({"group_instance_id": cfg.instance_id} if cfg.static_membership else {}),
            **fetch_settings(),
        )

    def session_timeout_ms(self) -> int:
        """``session.timeout.ms`` from ``extra_config``, else by the cluster's size (asked once)."""
        if self._session_ms is None:
            given = self.config.extra_config.get("session.timeout.ms")
            self._session_ms = int(given) if given is not None else self._default_session_timeout_ms()
        return self._session_ms

    def _default_session_timeout_ms(self) -> int:
        cfg = self.config
        try:
            brokers = kafka.broker_count(cfg.bootstrap, cfg.extra_config)
        except KafkaException as exc:  # no broker answered: the timeout that survives a node's death
            logger.info(
                "cluster size unknown (%s): group session timeout %d ms", exc, REPLICATED_SESSION_TIMEOUT_MS
            )
            return REPLICATED_SESSION_TIMEOUT_MS
        timeout = SESSION_TIMEOUT_MS if brokers == 1 else REPLICATED_SESSION_TIMEOUT_MS
        logger.info("%d broker(s): group session timeout %d ms", brokers, timeout)
        return timeout

    def session_timeout_s(self) -> float:
        return self.session_timeout_ms() / 1000
