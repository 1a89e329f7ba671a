"""From a Kafka record to a :class:`ConsumedMessage`, and from a message to its aside copies."""

from __future__ import annotations

from typing import Any

from txbridge.consumer.dlq import Headers, origin_of, parse_origin, user_headers
from txbridge.consumer.model import ConsumedMessage
from txbridge.consumer.retry import H_DUE
from txbridge.consumer.tags import tag_of
from txbridge.errors import WireFormatError
from txbridge.wire import H_ORIGIN, H_RETRY_COUNT


def _header(headers: list[tuple[str, bytes]], name: str) -> str | None:
    found = None
    for key, value in headers:
        if key == name:
            found = value
    if found is None:
        return None
    try:
        return found.decode("ascii")
    except UnicodeDecodeError:
        raise WireFormatError(f"header {name} is not ASCII text") from None


def to_consumed(msg: Any, *, is_retry: bool = False) -> ConsumedMessage:
    """The listener's view of a record (a retry record shows its original coordinates).

    Raises:
        WireFormatError: the tag header is not UTF-8, or a retry record's bookkeeping headers are bad.
    """
    raw_headers: list[tuple[str, bytes]] = [(k, v if v is not None else b"") for k, v in msg.headers() or ()]
    source = origin_of(msg.topic(), msg.partition(), msg.offset())
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    retries = 0
    if is_retry:
        origin = _header(raw_headers, H_ORIGIN)
        count = _header(raw_headers, H_RETRY_COUNT)
        if origin is None or count is None or not count.isdigit():
            raise WireFormatError(f"retry record {source} lacks a valid {H_ORIGIN} or {H_RETRY_COUNT} header")
        topic, partition, offset = parse_origin(origin)
        retries = int(count)
    _, timestamp = msg.timestamp()
    return ConsumedMessage(
        topic=topic,
        partition=partition,
        offset=offset,
        key=msg.key(),
        value=msg.value(),
        headers=tuple(raw_headers),
        tag=tag_of(raw_headers),
        timestamp_ms=timestamp,
        reconsume_times=retries,
        source=source,
    )


def due_ms(msg: Any) -> int:
    """A retry record's due time (ms since the epoch); 0 when it has none (due at once).

    Raises:
        WireFormatError: the header is not a whole number.
    """
    headers = [(k, v if v is not None else b"") for k, v in msg.headers() or ()]
    text = _header(headers, H_DUE)
    if text is None:
        return 0
    if not text.isdigit():
        raise WireFormatError(f"header {H_DUE}={text!r} is not a whole number of ms")
    return int(text)


def raw_origin(msg: Any, message: ConsumedMessage | None) -> str:
    """Where a record was first read: the message's coordinates, else the record's own."""
    if message is not None:
        return origin_of(message.topic, message.partition, message.offset)
    return origin_of(msg.topic(), msg.partition(), msg.offset())


def raw_user_headers(msg: Any) -> Headers:
    return user_headers(msg.headers())
