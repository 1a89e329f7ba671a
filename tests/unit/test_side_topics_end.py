"""Reading a side topic's end while its partition's leader is being elected (no broker)."""

from __future__ import annotations

from typing import Any

import pytest

from txbridge import _side_topics
from txbridge.errors import KafkaOperationError
from txbridge.kafka import KafkaError, KafkaException


class Client:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def get_watermark_offsets(self, _tp: Any, timeout: float) -> tuple[int, int]:
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer


def test_a_leader_being_elected_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_side_topics.time, "sleep", lambda _s: None)
    client = Client([KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (0, 7)])
    assert _side_topics._end_of(client, "ns_expired", 0) == (0, 7)


def test_another_error_is_not_retried_and_names_the_partition() -> None:
    client = Client([KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 7)])
    with pytest.raises(KafkaOperationError, match="reading the end of ns_expired/0"):
        _side_topics._end_of(client, "ns_expired", 0)
    assert client.answers == [(0, 7)]
