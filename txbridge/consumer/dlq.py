"""Moving a message aside: to the group's retry topic or its dead-letter topic.

Records keep their key, value and user headers; txbridge's own bookkeeping
headers (``txb.reason``, ``txb.origin``, ``txb.retry``, ``txb.due``) are replaced,
not duplicated. ``txb.origin`` names where the message was first read, across
every retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from txbridge.consumer.retry import H_DUE
from txbridge.errors import KafkaOperationError, WireFormatError
from txbridge.kafka import Producer
from txbridge.wire import H_ORIGIN, H_REASON, H_RETRY_COUNT

logger = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
_BOOKKEEPING = frozenset({H_REASON, H_ORIGIN, H_RETRY_COUNT, H_DUE})


def origin_of(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


def parse_origin(origin: str) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` from ``<topic>/<partition>/<offset>``.

    Raises:
        WireFormatError: not in that form.
    """
    topic, _, rest = origin.partition("/")
    partition, _, offset = rest.partition("/")
    if topic and partition.isdigit() and offset.isdigit():
        return topic, int(partition), int(offset)
    raise WireFormatError(f"header {H_ORIGIN}={origin!r} is not <topic>/<partition>/<offset>")


def user_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> Headers:
    """The headers without txbridge's move-aside bookkeeping."""
    return [(k, v if v is not None else b"") for k, v in headers or () if k not in _BOOKKEEPING]


def retry_headers(headers: Headers, origin: str, retry: int, due_ms: int) -> Headers:
    return [
        *headers,
        (H_ORIGIN, origin.encode()),
        (H_RETRY_COUNT, str(retry).encode()),
        (H_DUE, str(due_ms).encode()),
    ]


def dead_letter_headers(headers: Headers, origin: str, retries: int, reason: str) -> Headers:
    return [
        *headers,
        (H_REASON, reason.encode("utf-8", "replace")),
        (H_ORIGIN, origin.encode()),
        (H_RETRY_COUNT, str(retries).encode()),
    ]


class Forwarder:
    """Sends records aside and waits for the broker's acknowledgement.

    A message counts as processed only once its copy is acknowledged, so a crash
    in between replays it instead of losing it. Thread-safe (the producer is).
    """

    def __init__(self, producer: Producer, stop: threading.Event, *, attempt_timeout_s: float = 30.0) -> None:
        self._producer = producer
        self._stop = stop
        self._attempt_timeout_s = attempt_timeout_s

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> bool:
        """Send until acknowledged; False if the consumer stopped first (the message stays unprocessed)."""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._send_once(topic, key, value, headers)
            except KafkaOperationError as exc:
                logger.warning("could not write to %s (%s); retrying in %.1fs", topic, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            else:
                return True
        return False

    def _send_once(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        from txbridge import kafka

        done = threading.Event()
        outcome: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            outcome.append(err)
            done.set()

        self._producer.produce(
            topic, key=key, value=value, headers=cast("kafka.Headers", headers), on_delivery=delivered
        )
        deadline = time.monotonic() + self._attempt_timeout_s
        while not done.is_set():
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"no acknowledgement from {topic} within {self._attempt_timeout_s}s"
                )
            self._producer.poll(0.05)
        if outcome[0] is not None:
            raise kafka.to_error(outcome[0], f"writing to {topic}")
