"""What a listener receives and answers: messages, statuses and contexts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ConsumeOrderlyStatus(StrEnum):
    """An orderly listener's answer (RocketMQ's ``ConsumeOrderlyStatus``)."""

    SUCCESS = "SUCCESS"
    #: Pause this partition for the suspend time, then deliver the same message again.
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class ConsumeConcurrentlyStatus(StrEnum):
    """A concurrent listener's answer (RocketMQ's ``ConsumeConcurrentlyStatus``)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    #: Send the message to the group's retry topic; it comes back after the next delay.
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass(frozen=True)
class ConsumedMessage:
    """One message as a listener sees it.

    Attributes:
        topic: the topic the message was sent to (for a retried message, its original topic).
        partition: its partition there.
        offset: its offset there.
        key: the record key.
        value: the record value.
        headers: every header, in order (the user's, ``txb.tags``, ``txb.tx``; ``txb.retry`` on a retry).
        tag: the ``txb.tags`` tag, or None.
        timestamp_ms: the record's timestamp.
        reconsume_times: how often it was consumed before (0 on first delivery).
        source: ``<topic>/<partition>/<offset>`` of the record actually read (the retry topic's for a retry).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    tag: str | None
    timestamp_ms: int
    reconsume_times: int
    source: str

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


@dataclass
class OrderlyContext:
    """Per-call context of an orderly listener.

    Attributes:
        attempt: 1 on first delivery, 2 on the first redelivery, ...
        suspend_s: how long to suspend the partition if this call fails; the listener
            may change it (bounded by the consumer's ``max_suspend_s``).
    """

    attempt: int
    suspend_s: float


@dataclass
class ConcurrentContext:
    """Per-call context of a concurrent listener.

    Attributes:
        attempt: 1 on first delivery, 2 on the first retry, ...
        delay_s: when set by the listener, the delay before the next retry instead of the schedule's.
    """

    attempt: int
    delay_s: float | None = None


OrderlyListener = Callable[[ConsumedMessage, OrderlyContext], Any]
ConcurrentListener = Callable[[ConsumedMessage, ConcurrentContext], Any]
