"""Reading a side topic's end while its partition's leader is being elected (no broker).

The broker-backed paths (``txbridge admin`` right after ``txbridge init``, the expiry
resumer) are in ``tests/coordinator/test_expiry_admin.py`` and ``test_expiry_resume.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from txbridge import _side_topics
from txbridge.errors import KafkaOperationError
from txbridge.kafka import KafkaError, KafkaException


class Client:
    """One client's answers; a client that was told NOT_LEADER keeps saying it (stale metadata)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        partition = SimpleNamespace(id=0)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: partition})})

    def get_watermark_offsets(self, _tp: Any, timeout: float) -> tuple[int, int]:
        assert timeout <= 10
        if isinstance(self.answer, int):
            raise KafkaException(KafkaError(self.answer))
        return self.answer

    def close(self) -> None:
        self.closed = True


def _clients(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> list[Client]:
    made: list[Client] = []

    def consumer(*_args: Any, **_kwargs: Any) -> Client:
        made.append(Client(answers[len(made)]))
        return made[-1]

    monkeypatch.setattr(_side_topics.kafka, "consumer", consumer)
    monkeypatch.setattr(_side_topics.time, "sleep", lambda _s: None)
    return made


def _ends() -> dict[int, tuple[int, int]]:
    return _side_topics._ends("b:9092", "ns_expired", None, None, open_included=True)


def test_a_leader_being_elected_is_asked_again_with_a_new_client(monkeypatch: pytest.MonkeyPatch) -> None:
    electing = [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE]
    made = _clients(monkeypatch, [*electing, (0, 7)])
    assert _ends() == {0: (0, 7)}
    assert len(made) == 3
    assert all(client.closed for client in made)


def test_another_error_is_not_retried_and_names_the_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _clients(monkeypatch, [KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 7)])
    with pytest.raises(KafkaOperationError, match="reading the end of ns_expired/0"):
        _ends()
    assert len(made) == 1


def test_an_election_that_does_not_end_fails_with_the_brokers_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(_side_topics.time, "monotonic", lambda: now[0])
    made = _clients(monkeypatch, [KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    monkeypatch.setattr(_side_topics.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    with pytest.raises(KafkaOperationError, match="NOT_LEADER_FOR_PARTITION"):
        _ends()
    assert 20 <= len(made) <= 31  # every half second for the 15 s it waits
