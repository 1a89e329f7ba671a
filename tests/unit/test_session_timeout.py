"""The coordinator's group session timeout: short on one broker, past a node's death on a cluster.

On a cluster, Kafka's group coordinator answers a heartbeat only once its earlier writes on the
group's ``__consumer_offsets`` partition are replicated, which a dead follower holds until the
controller fences its node (9 s by default): a session shorter than that is lost at every node
death (the bench's ``nodekill`` step on the secured cluster checks the stall this causes).
"""

from __future__ import annotations

import pytest

from coordinator import service
from coordinator.config import CoordinatorConfig
from txbridge.kafka import KafkaException


def _coordinator(**extra: str) -> service.Coordinator:
    return service.Coordinator(CoordinatorConfig(bootstrap="b:1", extra_config=extra))


@pytest.mark.parametrize(
    ("brokers", "expected"), [(1, service.SESSION_TIMEOUT_MS), (3, service.REPLICATED_SESSION_TIMEOUT_MS)]
)
def test_the_session_timeout_follows_the_clusters_size(
    monkeypatch: pytest.MonkeyPatch, brokers: int, expected: int
) -> None:
    asked: list[str] = []

    def broker_count(bootstrap: str, _extra: object) -> int:
        asked.append(bootstrap)
        return brokers

    monkeypatch.setattr(service.kafka, "broker_count", broker_count)
    coordinator = _coordinator()

    assert coordinator._session_timeout_ms() == expected
    assert coordinator._session_timeout_s() == expected / 1000
    assert asked == ["b:1"]  # asked once, then kept


def test_a_session_timeout_in_extra_config_wins_and_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def broker_count(_bootstrap: str, _extra: object) -> int:
        raise AssertionError("the cluster was asked although the setting was given")

    monkeypatch.setattr(service.kafka, "broker_count", broker_count)

    assert _coordinator(**{"session.timeout.ms": "7000"})._session_timeout_ms() == 7000


def test_a_cluster_that_does_not_answer_gets_the_timeout_that_survives_a_node_death(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broker_count(_bootstrap: str, _extra: object) -> int:
        raise KafkaException("no broker answered")

    monkeypatch.setattr(service.kafka, "broker_count", broker_count)

    assert _coordinator()._session_timeout_ms() == service.REPLICATED_SESSION_TIMEOUT_MS
