"""Reading what the coordinator set aside (``<ns>_expired``, ``<ns>_quarantine``) for ``txbridge admin``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from txbridge import kafka
from txbridge.consumer.dlq import parse_origin
from txbridge.errors import TxBridgeError, WireFormatError
from txbridge.kafka import Producer
from txbridge.wire import H_CHECKS, H_ORIGIN, H_REASON, HalfMessage

Extra = Mapping[str, Any] | None
_ASIDE_HEADERS = frozenset({H_REASON, H_ORIGIN, H_CHECKS})


def _group() -> str:
    return f"txbridge-admin-{uuid.uuid4().hex[:8]}"


def read_committed(
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    *,
    wait_for_open: bool = False,
    timeout: float = 60.0,
    extra: Extra = None,
) -> list[Any]:
    """The committed records of ``topic`` below the end offsets it has when called.

    The end is the last stable offset, below any transaction open now; with
    ``wait_for_open``, the high watermark: the read then waits for the transactions open
    now to end, so one committed before the call is always seen (admin markers). Either
    way the read stops at the ends found first: a partition written to all the time (a
    coordinator commits every few ms) does not keep it reading.

    Raises:
        TxBridgeError: the topic does not exist.
        KafkaOperationError: the read failed or did not reach the ends within ``timeout``.
    """
    ends = watermarks(bootstrap, topic, partitions, extra=extra, open_included=wait_for_open)
    consumer = kafka.consumer(bootstrap, _group(), extra)
    try:
        wanted = {p: end for p, (low, end) in ends.items() if end > low}
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in wanted])
        held = " (an open Kafka transaction holds them back)" if wait_for_open else ""
        return list(
            kafka.read_to_end(consumer, topic, wanted, timeout=timeout, what=f"reading {topic}", late=held)
        )
    finally:
        consumer.close()


def watermarks(
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    *,
    extra: Extra = None,
    open_included: bool,
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, end)}``: the high watermark when ``open_included``, else the last stable offset."""
    isolation = "read_uncommitted" if open_included else "read_committed"
    client = kafka.consumer(bootstrap, _group(), extra, isolation_level=isolation)
    try:
        meta = client.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TxBridgeError(
                f"topic {topic} does not exist: run 'txbridge init' with the right --namespace"
            )
        numbers = sorted(meta.partitions) if partitions is None else partitions
        out = {}
        for number in numbers:
            try:
                out[number] = client.get_watermark_offsets(kafka.partition_at(topic, number), timeout=10)
            except Exception as exc:
                raise kafka.to_error(exc, f"reading the end of {topic}/{number}") from exc
        return out
    finally:
        client.close()


def origin_of(headers: Mapping[str, bytes]) -> tuple[str, int | None, int | None]:
    """``txb.origin`` (``<topic>/<partition>/<offset>``) as text, and the partition and offset it names."""
    origin = headers.get(H_ORIGIN, b"").decode("utf-8", "replace")
    try:
        _topic, partition, offset = parse_origin(origin)
    except WireFormatError:
        return origin, None, None
    return origin, partition, offset


def reason_of(headers: Mapping[str, bytes]) -> str:
    return headers.get(H_REASON, b"").decode("utf-8", "replace")


def original(half: HalfMessage) -> HalfMessage:
    """A copied half without the headers the coordinator added when it set it aside."""
    kept = tuple((n, v) for n, v in half.user_headers if n not in _ASIDE_HEADERS)
    return half._replace(user_headers=kept)


def check_destinations(
    bootstrap: str, messages: Sequence[HalfMessage], extra: Extra = None
) -> dict[str, Any]:
    """Raise unless every message's topic and explicit partition exist. Returns all topics' metadata.

    A consumer asks: it never creates a missing topic, where a producer would on a broker
    with ``auto.create.topics.enable``.

    Raises:
        TxBridgeError: a topic or partition is missing; the message says what to create.
    """
    consumer = kafka.consumer(bootstrap, _group(), extra)
    try:
        topics: dict[str, Any] = consumer.list_topics(timeout=10).topics
    except Exception as exc:
        raise kafka.to_error(exc, "reading topic metadata") from exc
    finally:
        consumer.close()
    for msg in messages:
        meta = topics.get(msg.topic)
        if meta is None or meta.error is not None:
            raise TxBridgeError(f"topic {msg.topic} does not exist: create it, then run this again")
        if msg.partition is not None and not 0 <= msg.partition < len(meta.partitions):
            raise TxBridgeError(
                f"topic {msg.topic} has {len(meta.partitions)} partition(s), not partition {msg.partition}: "
                "add partitions (kafka-topics --alter), then run this again"
            )
    return topics


def produce(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    *,
    headers: Sequence[tuple[str, bytes]] = (),
    partition: int | None = None,
) -> None:
    """One record into the producer's open Kafka transaction (the partitioner's choice unless given)."""
    kwargs: dict[str, Any] = {"key": key, "value": value, "headers": list(headers)}
    if partition is not None:
        kwargs["partition"] = partition
    producer.produce(topic, **kwargs)


def as_dict(extra: Extra) -> dict[str, Any] | None:
    return dict(extra) if extra is not None else None
