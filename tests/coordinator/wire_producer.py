"""Writes half, op and registry records exactly as docs/wire-format.md says, without the SDK.

The coordinator's tests drive it with this, so they do not depend on the producer SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from txbridge import kafka
from txbridge.wire import (
    HalfMessage,
    OpRecord,
    OpSource,
    ProducerInstance,
    Topics,
    TxState,
    half_partition,
    new_tx_id,
)


@dataclass(frozen=True)
class Msg:
    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None


class WireProducer:
    """Half records (idempotent, acks=all, acknowledged), op records and heartbeats."""

    def __init__(
        self, bootstrap: str, namespace: str, partitions: int, group: str = "orders", instance: str = "inst-1"
    ) -> None:
        self.topics = Topics(namespace)
        self.partitions = partitions
        self.group, self.instance = group, instance
        self._producer = kafka.producer(bootstrap)

    def partition_of(self, tx_id: str, messages: Sequence[Msg]) -> int:
        order_key = messages[0].key if messages and messages[0].key is not None else tx_id.encode()
        return half_partition(order_key, self.partitions)

    def halves(
        self,
        messages: Sequence[Msg],
        *,
        tx_id: str | None = None,
        check_after: float | None = None,
        instance: str | None = None,
        flush: bool = True,
    ) -> tuple[str, int]:
        """Write the half records of a new transaction. Returns ``(tx_id, partition)``."""
        tx_id = tx_id or new_tx_id()
        partition = self.partition_of(tx_id, messages)
        for seq, msg in enumerate(messages):
            half = HalfMessage(
                tx_id=tx_id,
                seq=seq,
                topic=msg.topic,
                value=msg.value,
                key=msg.key,
                partition=msg.partition,
                group=self.group,
                instance=instance or self.instance,
                timestamp_ms=1,  # a wildly wrong producer clock: it must never matter
                check_after_s=check_after,
                user_headers=msg.headers,
            )
            self._producer.produce(
                self.topics.half,
                key=half.record_key(),
                value=msg.value,
                headers=half.to_headers(),
                partition=partition,
            )
        if flush:
            self.flush()
        return tx_id, partition

    def op(
        self,
        tx_id: str,
        partition: int,
        state: TxState,
        *,
        count: int | None = None,
        source: OpSource = OpSource.PRODUCER,
        flush: bool = True,
    ) -> None:
        key, value = OpRecord(tx_id, state, source, count, self.group, self.instance).encode()
        self._producer.produce(self.topics.op, key=key, value=value, partition=partition)
        if flush:
            self.flush()

    def transaction(self, messages: Sequence[Msg], outcome: TxState, *, flush: bool = True) -> str:
        """Halves, then the producer's op (none for UNKNOWN), like the SDK does."""
        tx_id, partition = self.halves(messages, flush=flush)
        if outcome is not TxState.UNKNOWN:
            count = len(messages) if outcome is TxState.COMMIT else None
            self.op(tx_id, partition, outcome, count=count, flush=flush)
        return tx_id

    def raw(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: list | None = None
    ) -> None:
        self._producer.produce(topic, key=key, value=value, headers=headers or [], partition=partition)
        self.flush()

    def heartbeat(
        self,
        url: str,
        *,
        instance: str | None = None,
        group: str | None = None,
        interval_s: float = 0.0,
        decisive: bool = False,
    ) -> None:
        beat = ProducerInstance(
            group or self.group, instance or self.instance, url, interval_s=interval_s, decisive=decisive
        )
        self._producer.produce(self.topics.producers, key=beat.key(), value=beat.encode(), partition=0)
        self.flush()

    def leave(self, *, instance: str | None = None, group: str | None = None) -> None:
        key = f"{group or self.group}/{instance or self.instance}".encode()
        self._producer.produce(self.topics.producers, key=key, value=None, partition=0)
        self.flush()

    def flush(self) -> None:
        remaining = self._producer.flush(30)
        if remaining:
            raise RuntimeError(f"{remaining} records were not acknowledged")
