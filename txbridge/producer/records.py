"""The half and op records one producer instance writes (wire format v1), encoded on its hot path.

The same bytes as :meth:`txbridge.wire.HalfMessage.to_headers` and
:meth:`txbridge.wire.OpRecord.encode` (a unit test pins it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from txbridge import wire
from txbridge.errors import SerializationError
from txbridge.serializers import Serializer
from txbridge.tracing import has_traceparent
from txbridge.transaction import Message
from txbridge.wire import TxState


def serialize_key(serializer: Serializer, key: Any) -> bytes | None:
    try:
        return serializer.serialize(key)
    except SerializationError:
        raise
    except Exception as exc:  # a user serializer may raise anything; report it in txbridge's tree
        raise SerializationError(f"key serializer {serializer!r} failed: {exc}") from exc


class HalfRecord(NamedTuple):
    """A half record ready to produce: its Kafka key and value, its headers, the serialized message key."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]
    message_key: bytes | None


class Decision(NamedTuple):
    """One transaction's decision as a batched op record carries it."""

    tx_id: str
    state: TxState
    messages: int | None  # the COMMIT's message count (None for a ROLLBACK)
    reason: str = ""


class RecordEncoder:
    """Encodes one producer instance's half and op records (wire format v1).

    The same bytes as :meth:`wire.HalfMessage.to_headers` and :meth:`wire.OpRecord.encode`
    (a unit test pins it), with what every record of the instance shares (version,
    group and instance headers, the op record's JSON fields) encoded once: this is
    the producer's per-transaction hot path.

    Args:
        group: the producer group.
        instance: this instance's id.
        key_serializer: turns message keys into bytes.
        value_serializer: turns message values into bytes.
        source: the source of truth this instance's check answers from (:func:`check_source`).
    """

    def __init__(
        self,
        group: str,
        instance: str,
        key_serializer: Serializer,
        value_serializer: Serializer,
        source: str | None = None,
    ) -> None:
        self.key_serializer = key_serializer
        self._source = None if source is None else (wire.H_SOURCE, source.encode())
        self.value_serializer = value_serializer
        self._version = (wire.H_VERSION, str(wire.VERSION).encode())
        self._group = (wire.H_GROUP, group.encode())
        self._instance = (wire.H_INSTANCE, instance.encode())
        who = f'"group":{json.dumps(group)},"instance":{json.dumps(instance)}'
        self._batch_head = f'{{"v":{wire.VERSION},"source":"{wire.OpSource.PRODUCER.value}",{who},"ts":'
        self._op_head = f'{{"v":{wire.VERSION},"tx":"'
        self._op_after_tx = {
            state: f'","state":"{state.value}","source":"{wire.OpSource.PRODUCER.value}",{who},"ts":'
            for state in (TxState.COMMIT, TxState.ROLLBACK)
        }

    def halves(
        self,
        tx_id: str,
        messages: Sequence[Message],
        first_seq: int,
        trace_headers: Sequence[tuple[str, bytes]] = (),
    ) -> list[HalfRecord]:
        """The half records of ``messages``, numbered from ``first_seq``.

        ``trace_headers`` (``traceparent``, ``tracestate``: the transaction's span) go into every
        record whose message does not carry a ``traceparent`` of its own.

        Raises:
            SerializationError: a key or value cannot be serialized (nothing is written then).
        """
        tx = tx_id.encode()
        ts = (wire.H_TS, str(time.time_ns() // 1_000_000).encode())
        records = []
        for seq, msg in enumerate(messages, first_seq):
            try:
                value = self.value_serializer.serialize(msg.value)
            except SerializationError:
                raise
            except Exception as exc:  # see serialize_key
                raise SerializationError(f"value serializer {self.value_serializer!r} failed: {exc}") from exc
            key = serialize_key(self.key_serializer, msg.key)
            headers = [
                self._version,
                (wire.H_TX, tx),
                (wire.H_SEQ, str(seq).encode()),
                (wire.H_TOPIC, msg.topic.encode()),
                self._group,
                self._instance,
                ts,
            ]
            if msg.partition is not None:
                headers.append((wire.H_PARTITION, str(msg.partition).encode()))
            if key is not None:
                headers.append((wire.H_KEY, key))
            if msg.check_after is not None:
                headers.append((wire.H_CHECK_AFTER, repr(float(msg.check_after)).encode()))
            if value is None:
                headers.append((wire.H_NULL, b"1"))
            if self._source is not None:
                headers.append(self._source)
            if msg.headers:
                headers.extend(msg.header_pairs)
            if trace_headers and not has_traceparent(msg.header_pairs):
                headers.extend(trace_headers)
            records.append(HalfRecord(tx, value, headers, key))
        return records

    def op(self, tx_id: str, state: TxState, *, count: int | None, reason: str = "") -> tuple[bytes, bytes]:
        """``(key, value)`` of the producer's COMMIT or ROLLBACK op record.

        ``tx_id`` is one of this producer's UUIDs, so it needs no JSON escaping.
        """
        body = self._op_head + tx_id + self._op_after_tx[state] + str(time.time_ns() // 1_000_000)
        if count is not None:
            body += f',"count":{count}'
        if reason:
            body += f',"reason":{json.dumps(reason)}'
        return tx_id.encode(), (body + "}").encode()

    def decisions(self, decisions: Sequence[Decision]) -> tuple[bytes | None, bytes]:
        """``(key, value)`` of the op record of ``decisions``: the one-decision record for one
        (:meth:`op`), a batch for more (:meth:`ops`)."""
        return self.decision(decisions[0]) if len(decisions) == 1 else self.ops(decisions)

    def decision(self, decision: Decision) -> tuple[bytes, bytes]:
        """``(key, value)`` of the one-decision op record of ``decision`` (:meth:`op`)."""
        return self.op(decision.tx_id, decision.state, count=decision.messages, reason=decision.reason)

    def ops(self, decisions: Sequence[Decision]) -> tuple[None, bytes]:
        """``(key, value)`` of one op record holding several of this producer's decisions: a
        batch, with no key (docs/wire-format.md). The tx ids are this producer's UUIDs."""
        entries = ",".join(
            f'["{tx_id}","{state.value}",{"null" if count is None else count}'
            + (f",{json.dumps(reason)}]" if reason else "]")
            for tx_id, state, count, reason in decisions
        )
        body = f'{self._batch_head}{time.time_ns() // 1_000_000},"ops":[{entries}]}}'
        return None, body.encode()
