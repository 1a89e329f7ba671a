"""A take-over's read of a partition's offsets that gets no answer in time (a broker SIGKILLed
mid-take-over, in a nemesis run) is a retriable Kafka error, which the take-over asks again;
it used to escape as the admin future's bare ``TimeoutError`` and end the coordinator's process.
The real broker answers in tests/coordinator/test_restore_ends.py."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, cast

import pytest

from txbridge import kafka
from txbridge.errors import KafkaOperationError
from txbridge.kafka import TopicPartition


class SilentAdmin:
    """An admin client whose list_offsets requests are never answered."""

    def list_offsets(
        self, asked: dict[TopicPartition, Any], **_options: Any
    ) -> dict[TopicPartition, Future[Any]]:
        return {tp: Future() for tp in asked}


def test_offsets_not_answered_in_time_are_a_retriable_kafka_error_naming_the_partition() -> None:
    with pytest.raises(KafkaOperationError, match=r"the offsets of t/0: no answer within 0.05s") as raised:
        kafka.offset_bounds(cast(Any, SilentAdmin()), "t", [0, 1], timeout=0.05)

    assert raised.value.retriable
