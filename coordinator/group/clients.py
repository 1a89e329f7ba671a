"""The group's consumer and the clients' recovery: joining, rejoining, stuck calls.

The coordinator's clients are replaced in-process when one fails, as a restart would: a
partition's producer fenced by another owner (this coordinator was a zombie: its session
expired while it was stopped), a producer failed fatally, a commit outlived its timeout
(confluentinc/librdkafka#5511: it waits forever for a dead group coordinator), or the consumer
failed. librdkafka fences its own static member when the broker acting as the group's
coordinator dies (confluentinc/librdkafka#3437): the consumer never fetches again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from coordinator.config import CoordinatorConfig
from coordinator.failures import Failures
from coordinator.group import membership
from coordinator.monitoring.metrics import Stat, Stats
from coordinator.monitoring.watchdog import Watchdog
from txbridge import kafka
from txbridge.errors import KafkaOperationError, ProducerFencedError
from txbridge.kafka import Consumer, TopicPartition
from txbridge.wire import Topics

logger = logging.getLogger(__name__)

#: Clients that fail fatally are replaced in-process (rejoin) at most this many times in
#: REJOIN_WINDOW_S; more means another process uses the same instance id (its static
#: membership fences this one's over and over): the coordinator stops. A fence by another
#: owner's claim is not counted: transactional ids are an incarnation's own, so it says only
#: that the partitions moved on (a session that expired), not who else runs as this instance.
REJOINS_MAX = 5
REJOIN_WINDOW_S = 300.0
#: A coordinator fenced by another owner this soon after it started, while a coordinator group
#: other than its own holds the namespace's partitions, got past the start's refusal
#: (membership.refuse_another_group) while that group rebalanced: it is the second group, and it
#: refuses now, as at the start, instead of taking the partitions back and forth with the first.
NEWCOMER_S = 120.0
#: Under the consumer protocol the broker refuses a static member whose instance id another
#: member still holds (it does not fence the holder, as the classic protocol does): after a
#: crash, the previous life's member until its session expires. The refusals are not counted
#: as another process for this long (above the longest session a broker allows by default,
#: group.consumer.max.session.timeout.ms); joining is tried again every UNRELEASED_RETRY_S.
UNRELEASED_WAIT_S = 75.0
UNRELEASED_RETRY_S = 1.0


class RebalanceListener(Protocol):
    """What a join subscribes with and a rejoin resets (:class:`coordinator.group.rebalance.Rebalancer`)."""

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def reset(self) -> None:
        """Let go of every partition, of the clients' uncommitted work and of the take-overs
        queued: the clients are replaced."""


class GroupClients:
    """Holds the group's consumer; joins the group, and joins it again with new clients.

    Args:
        config: the coordinator's settings.
        topics: the namespace's topics.
        stats: the counters.
        failures: what asks for new clients, and where the coordinator's end is set.
        watchdog: every blocking call runs under it.
        stopping: set when the coordinator must stop.
        make_consumer: a new half/op consumer of the group, not yet subscribed.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        topics: Topics,
        *,
        stats: Stats,
        failures: Failures,
        watchdog: Watchdog,
        stopping: threading.Event,
        make_consumer: Callable[[], Consumer],
    ) -> None:
        self.config = config
        self.topics = topics
        self.stats = stats
        self._make_consumer = make_consumer
        self._watchdog = watchdog
        self._failures = failures
        self._stopping = stopping
        self._consumer: Consumer | None = None
        self._rejoins: list[float] = []  # monotonic times of recent rejoins
        self._refused_since: float | None = None  # first refusal of the instance id (UNRELEASED_WAIT_S)
        self._started: float | None = None  # the first join (NEWCOMER_S)

    def consumer(self) -> Consumer:
        """The group's consumer (half + op), while the coordinator holds one."""
        return kafka.opened(self._consumer, "the coordinator's consumer")

    def held(self) -> bool:
        """Whether the coordinator holds a consumer."""
        return self._consumer is not None

    def join(self, listener: RebalanceListener) -> None:
        """Create the half/op consumer and subscribe: the group assigns this instance its
        partitions, and ``listener`` takes them over and lets them go."""
        if self._started is None:
            self._started = time.monotonic()
        consumer = self._consumer = self._make_consumer()
        consumer.subscribe(
            [self.topics.half, self.topics.op],
            on_assign=self._current_only(consumer, listener.on_assign),
            on_revoke=self._current_only(consumer, listener.on_revoke),
            on_lost=self._current_only(consumer, listener.on_lost),
        )

    def _current_only(
        self, consumer: Consumer, callback: Callable[[Consumer, list[TopicPartition]], None]
    ) -> Callable[[Consumer, list[TopicPartition]], None]:
        """``callback``, run only while ``consumer`` is the one the coordinator holds.

        A consumer being replaced (:meth:`rejoin`) is closed after the listener was reset, and
        librdkafka serves the rebalance events still queued for it inside ``close()``: an
        assignment the group gave it after its last poll comes as an ``on_assign`` then, with no
        revocation after it. Taken over, it sought partitions that the new consumer was never
        given (``_STATE`` for a minute, then new clients, whose replaced consumer did the same:
        a resumed zombie went 100 s without a partition). What the group gives a replaced
        consumer is given again to the new one.
        """

        def call(given: Consumer, partitions: list[TopicPartition]) -> None:
            if consumer is not self._consumer:
                logger.info(
                    "ignoring a rebalance event of a replaced consumer (%s, %d partitions)",
                    callback.__name__,
                    len(partitions),
                )
                return
            callback(given, partitions)

        return call

    def rejoin(self, listener: RebalanceListener) -> None:
        """Replace the clients after one failed (:attr:`Failures.clients`), in-process.

        Its partitions' uncommitted work is dropped as when partitions are lost (it is above
        the committed positions and comes back from them), the consumer is closed, and a new
        one joins with the same instance id: the group hands it the same partitions at once,
        and the loop restores them from ``<ns>_state`` (:meth:`Rebalancer.take_over_queued`;
        :meth:`RebalanceListener.reset` dropped the take-overs the old consumer queued). Without
        this the process had to exit and start again (seconds of interpreter start-up on a
        loaded host). More than :data:`REJOINS_MAX` failures in :data:`REJOIN_WINDOW_S` stop the
        coordinator: that is another process using the same instance id, not a broker failover.
        A fence by another owner is not counted; one within :data:`NEWCOMER_S` of the start while
        another group serves the namespace stops this coordinator with the start's refusal.
        """
        error, self._failures.clients = self._failures.clients, None
        assert error is not None
        now = time.monotonic()
        instance = self.config.instance_id
        if self.config.group_protocol == "consumer" and kafka.is_unsupported(error):
            # The brokers' settings could not be read at start (membership.require_consumer_protocol).
            self._failures.fatal = KafkaOperationError(
                f"coordinator {instance} must stop: the brokers do not support the consumer group "
                f"protocol ({error}). Use a Kafka 4.0+ cluster with 'consumer' in "
                "group.coordinator.rebalance.protocols, or set group_protocol = classic "
                "(--group-protocol classic).",
                fatal=True,
            )
            logger.error("%s", self._failures.fatal)
            self._stopping.set()
            return
        if isinstance(error, ProducerFencedError):
            # Another owner claimed the partitions (not counted: see REJOINS_MAX).
            if self._refuse_as_second_group(now):
                return
        elif self._still_held(error, now):
            logger.info(
                "coordinator %s: instance id %s is still held by another member of group %s (a "
                "previous life's, until its session expires?); joining again in %.0fs",
                instance,
                instance,
                self.config.group_id,
                UNRELEASED_RETRY_S,
            )
            self._stopping.wait(UNRELEASED_RETRY_S)
        else:
            self._rejoins = [t for t in self._rejoins if now - t < REJOIN_WINDOW_S] + [now]
        if len(self._rejoins) > REJOINS_MAX:
            self._failures.fatal = KafkaOperationError(
                f"coordinator {instance} must stop: its clients failed {len(self._rejoins)} times in "
                f"{REJOIN_WINDOW_S:.0f}s; does another coordinator of group {self.config.group_id} run "
                f"with instance id {instance}? Give each running coordinator its own --instance-id. "
                f"Last failure: {error}",
                fatal=True,
            )
            logger.error("%s", self._failures.fatal)
            self._stopping.set()
            return
        logger.warning(
            "coordinator %s: a client failed (%s); joining the group again with a new consumer and producer",
            instance,
            error,
        )
        self.stats[Stat.CONSUMER_REJOINS] += 1
        listener.reset()
        old, self._consumer = self._consumer, None
        try:
            with self._watchdog.deadline("closing the failed consumer", 30):
                # nothing to commit: its partitions were dropped above
                kafka.opened(old, "the failed consumer").close()
        except Exception as exc:
            logger.info("closing the failed consumer: %s", exc)
        self.join(listener)

    def _refuse_as_second_group(self, now: float) -> bool:
        """Stop with the start's refusal if this coordinator is the newcomer of two groups
        serving the namespace (:data:`NEWCOMER_S`); whether it stops."""
        if self._started is None or now - self._started > NEWCOMER_S:
            return False
        other = membership.another_group_serving(self.config, self.topics)
        if other is None:
            return False
        self._failures.fatal = membership.served_by_another(self.config, *other)
        logger.error("coordinator %s must stop: %s", self.config.instance_id, self._failures.fatal)
        self._stopping.set()
        return True

    def _still_held(self, error: Exception, now: float) -> bool:
        """Whether ``error`` is the consumer protocol's refusal of this instance id, within
        :data:`UNRELEASED_WAIT_S` of the first one (then it is not counted as a rejoin)."""
        if not kafka.is_unreleased_instance(error):
            self._refused_since = None
            return False
        if self._refused_since is None:
            self._refused_since = now
        return now - self._refused_since < UNRELEASED_WAIT_S

    def close(self) -> None:
        """Close the consumer: it leaves the group, and its partitions move at once."""
        if self._consumer is None:
            return
        try:
            with self._watchdog.deadline("closing the consumer", 30):
                self._consumer.close()
        except Exception:
            logger.exception("closing the consumer")
