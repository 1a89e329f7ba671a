"""How a static member leaves without its partitions waiting out its session, and comes back.

librdkafka sends no LeaveGroup for a static member (KIP-345: a restart within the session
timeout is meant to get its partitions back without a rebalance), and confluent-kafka has no
call to remove a member. Left alone, a stopped static member's partitions stay assigned to it
until its session expires. So a stopping static member hands them over instead
(:meth:`coordinator.service.Coordinator._hand_over`): it subscribes to ``<ns>_state`` alone,
a topic the other members do not subscribe to. A known member that joins with new metadata
makes the group rebalance at once; the others take its half and op partitions, and it gets
the state topic's, which it never reads. (A pattern that matches no topic does not do:
librdkafka then sends no JoinGroup at all.) It then closes, and stays a member holding only
``<ns>_state`` until its session expires.

Its next life under the same instance id must not join before that: the broker would give it
the member's cached assignment without a rebalance, and it would idle while the others carry
its share. So a static member about to join first waits while its instance id is a member
holding only ``<ns>_state`` (:func:`wait_for_handed_over`). One that holds half and op
partitions (a crash, not a hand-over) is joined at once: it gets them back.

Under the consumer protocol (KIP-848) the same hand-over works (a changed subscription makes the
broker compute a new assignment at once), and the next life does not wait: the broker assigns
it afresh because its subscription differs. What differs there is a crash: the broker refuses a
member under an instance id that another still holds until that one's session expires
(:mod:`coordinator.group.clients` retries meanwhile), where the classic protocol fences the holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from coordinator.config import CoordinatorConfig
from txbridge import kafka
from txbridge.errors import ConfigurationError
from txbridge.kafka import TopicPartition
from txbridge.wire import Topics

logger = logging.getLogger(__name__)

_DESCRIBE_TIMEOUT_S = 5.0


def assignments(config: CoordinatorConfig) -> list[tuple[str | None, list[TopicPartition]]]:
    """``(group.instance.id, partitions assigned)`` of each member of the coordinator's group.

    Raises:
        Exception: the group could not be described.
    """
    admin = kafka.admin(config.bootstrap, config.extra_config)
    group = config.group_id
    described = admin.describe_consumer_groups([group], request_timeout=_DESCRIBE_TIMEOUT_S)[group]
    return [
        (m.group_instance_id, list(m.assignment.topic_partitions) if m.assignment else [])
        for m in described.result(_DESCRIBE_TIMEOUT_S).members
    ]


def _members(config: CoordinatorConfig) -> list[tuple[str | None, set[str]]]:
    """``(group.instance.id, topics assigned)`` of each member of the coordinator's group."""
    return [(instance, {tp.topic for tp in held}) for instance, held in assignments(config)]


def others_present(config: CoordinatorConfig, topics: Topics) -> bool:
    """Whether another member of the group serves half partitions, and so can take this one's.

    A member that serves none is left out: it may be a stopped coordinator's, handed over and
    waiting for its session to expire, which would hold the hand-over's rebalance until then.

    Raises:
        Exception: the group could not be described (the caller does not hand over then).
    """
    return any(instance != config.instance_id and topics.half in held for instance, held in _members(config))


def require_consumer_protocol(config: CoordinatorConfig) -> None:
    """Fail fast unless the cluster's group coordinators accept the consumer group protocol.

    Raises:
        ConfigurationError: the brokers do not (before Kafka 4.0, or
            ``group.coordinator.rebalance.protocols`` without ``consumer``).
    """
    accepted = kafka.group_protocols(config.bootstrap, config.extra_config, timeout=_DESCRIBE_TIMEOUT_S)
    if accepted is None:  # cannot tell (no DescribeConfigs right): the consumer's error says it
        logger.info("cannot read the brokers' group protocols; joining with the consumer protocol")
        return
    if "consumer" not in accepted:
        raise ConfigurationError(
            f"group_protocol = consumer, but the brokers at {config.bootstrap} do not support the "
            f"consumer group protocol (group.coordinator.rebalance.protocols = "
            f"{','.join(sorted(accepted)) or 'unset: a broker before Kafka 3.7'}). Use a Kafka 4.0+ "
            "cluster with 'consumer' in group.coordinator.rebalance.protocols, or set "
            "group_protocol = classic (--group-protocol classic)."
        )


def wait_for_handed_over(
    config: CoordinatorConfig, topics: Topics, session_timeout_s: Callable[[], float], stop: threading.Event
) -> None:
    """Before joining: while this instance id is a member of the group that holds only
    ``<ns>_state`` (its previous life handed its partitions over), wait for that member's
    session to expire (``session_timeout_s`` is asked only then)."""
    deadline: float | None = None  # set once it waits
    while not stop.is_set():
        try:
            mine = [held for instance, held in _members(config) if instance == config.instance_id]
        except Exception as exc:  # cannot tell: join now (at worst it idles until a rebalance)
            logger.info("describing group %s before joining: %s", config.group_id, exc)
            return
        if not mine or any(held != {topics.state} for held in mine):
            if deadline is not None:
                logger.info(
                    "instance %s: its previous member has left group %s", config.instance_id, config.group_id
                )
            return
        if deadline is None:
            session_s = session_timeout_s()
            deadline = time.monotonic() + session_s + 3.0
            logger.info(
                "instance %s: its previous member handed its partitions over and is still in group %s; "
                "joining once its session expires (within %.0fs), so that the group rebalances",
                config.instance_id,
                config.group_id,
                session_s,
            )
        elif time.monotonic() > deadline:
            logger.warning(
                "instance %s is still a member of group %s after %.0fs; joining anyway",
                config.instance_id,
                config.group_id,
                session_s,
            )
            return
        time.sleep(0.25)


def refuse_another_group(
    config: CoordinatorConfig, topics: Topics, session_timeout_s: Callable[[], float], stop: threading.Event
) -> None:
    """Before joining: refuse to start while a coordinator group other than this one's serves
    the namespace (a member of it holds half or op partitions).

    Exactly once needs one committer per namespace partition. The partitions' transactional ids
    name the namespace, not the group, so a second group fences the first partition by partition
    and publishes nothing twice; but the two would take the partitions from each other at every
    commit. Changing a namespace's group is stopping the old one, then starting the new
    (docs/coordinator.md): a stopped static member stays in its group until its session expires,
    so another group is waited for that long before it counts as serving (``session_timeout_s``
    is asked only then). Groups this principal may not describe are not seen; fencing still
    holds for them.

    Raises:
        ConfigurationError: another group still serves the namespace.
    """
    deadline: float | None = None
    while not stop.is_set():
        other = another_group_serving(config, topics)
        if other is None:
            return
        group, members = other
        if deadline is None:
            wait_s = session_timeout_s() + 3.0
            deadline = time.monotonic() + wait_s
            logger.info(
                "namespace %s is served by coordinator group %r (members %s): waiting up to %.0fs for "
                "them to leave (a stopped coordinator's session expires) before refusing to start",
                config.namespace,
                group,
                ", ".join(members),
                wait_s,
            )
        elif time.monotonic() > deadline:
            raise served_by_another(config, group, members)
        time.sleep(0.5)


def another_group_serving(config: CoordinatorConfig, topics: Topics) -> tuple[str, list[str]] | None:
    """A consumer group other than this coordinator's with a member holding half or op
    partitions, and those members; None when there is none or the groups cannot be listed
    (then fencing keeps it exact, and the caller goes on)."""
    try:
        serving = kafka.groups_consuming(
            config.bootstrap, [topics.half, topics.op], extra=config.extra_config, timeout=_DESCRIBE_TIMEOUT_S
        )
    except Exception as exc:
        logger.warning("could not list the consumer groups serving %s: %s", topics.half, exc)
        return None
    others = sorted((g, m) for g, m in serving.items() if g != config.group_id)
    return others[0] if others else None


def served_by_another(config: CoordinatorConfig, group: str, members: list[str]) -> ConfigurationError:
    """The refusal of a coordinator whose namespace ``group`` serves."""
    return ConfigurationError(
        f"namespace {config.namespace} is served by coordinator group {group!r} "
        f"(members {', '.join(members)}); this coordinator's group is {config.group_id!r}. "
        f"Start it with --group-id {group}, or stop every coordinator of {group!r} first to move "
        "the namespace to a new group (docs/coordinator.md, 'Changing a namespace's group')"
    )
