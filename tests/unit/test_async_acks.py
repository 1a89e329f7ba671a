"""The asyncio producer's delivery bridge without a broker: batching, failures, deadlines."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from txbridge import StringSerializer
from txbridge.delivery import DeliveryPump
from txbridge.errors import KafkaOperationError, TransactionStateError
from txbridge.producer.asyncio import _AckBridge
from txbridge.producer.records import Decision, RecordEncoder
from txbridge.wire import TxState, decode_op, decode_ops, new_tx_id


class _Msg:
    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 3


class FakePump:
    """Records each send's delivery callback; the test plays librdkafka's delivery thread."""

    def __init__(self, refuse: bool = False) -> None:
        self.callbacks: list[Any] = []
        self.refuse = refuse

    def send(self, topic: str, partition: int, key: Any, value: Any, **kw: Any) -> KafkaOperationError | None:
        if self.refuse:
            return KafkaOperationError("local queue full", retriable=True)
        self.callbacks.append(kw["on_delivery"])
        return None


def _bridge(pump: FakePump, timeout_s: float = 30.0) -> _AckBridge:
    return _AckBridge(asyncio.get_running_loop(), pump, timeout_s)  # type: ignore[arg-type]


def test_reports_from_another_thread_release_one_wait_in_record_order() -> None:
    async def main() -> list[BaseException]:
        pump = FakePump()
        bridge = _bridge(pump)
        acks = [bridge.write("t", 3, b"k", b"v", None) for _ in range(3)]

        def deliver() -> None:  # the delivery thread: the middle record fails
            for i, callback in enumerate(pump.callbacks):
                callback(KafkaError(KafkaError._MSG_TIMED_OUT) if i == 1 else None, _Msg())

        threading.Thread(target=deliver).start()
        return await asyncio.wait_for(bridge.wait(acks), 5)

    failures = asyncio.run(main())
    assert len(failures) == 1
    assert isinstance(failures[0], KafkaOperationError)
    assert "writing to t[3]" in str(failures[0])


def test_a_record_that_could_not_be_enqueued_fails_without_waiting() -> None:
    async def main() -> list[BaseException]:
        bridge = _bridge(FakePump(refuse=True))
        return await asyncio.wait_for(bridge.wait([bridge.write("t", 0, b"k", b"v", None)]), 1)

    [failure] = asyncio.run(main())
    assert "local queue full" in str(failure)


def test_a_wait_is_bounded_and_a_late_report_is_ignored() -> None:
    async def main() -> tuple[list[BaseException], list[BaseException]]:
        pump = FakePump()
        bridge = _bridge(pump, timeout_s=0.2)
        acks = [bridge.write("t", 0, b"k", b"v", None) for _ in range(2)]
        pump.callbacks[0](None, _Msg())
        failures = await asyncio.wait_for(bridge.wait(acks), 5)
        pump.callbacks[1](None, _Msg())  # too late: the timeout stands
        await asyncio.sleep(0.05)
        return failures, await bridge.wait(acks)

    failures, again = asyncio.run(main())
    assert [str(f) for f in failures] == ["a record was not acknowledged within 0s"]
    assert again == failures


def test_a_cancelled_wait_is_forgotten() -> None:
    async def main() -> int:
        pump = FakePump()
        bridge = _bridge(pump)
        waiting = asyncio.ensure_future(bridge.wait([bridge.write("t", 0, b"k", b"v", None)]))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        pump.callbacks[0](None, _Msg())  # the report still arrives: nothing to wake
        await asyncio.sleep(0.01)
        return len(bridge._waiting)

    assert asyncio.run(main()) == 0


def test_pump_send_refuses_before_start() -> None:
    with pytest.raises(TransactionStateError, match="not started"):
        DeliveryPump("127.0.0.1:1").send("t", 0, b"k", b"v", headers=None, on_delivery=lambda e, m: None)


class _Settings:
    """What :class:`_OpBatches` reads of a producer's settings."""

    op_topic = "ops"

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder


class _RecordingPump(FakePump):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, Any, bytes]] = []

    def send(self, topic: str, partition: int, key: Any, value: Any, **kw: Any) -> KafkaOperationError | None:
        self.records.append((partition, key, value))
        return super().send(topic, partition, key, value, **kw)


def _encoder() -> RecordEncoder:
    return RecordEncoder("g", "i", StringSerializer(), StringSerializer())


def _decision(i: int) -> Decision:
    return Decision(new_tx_id(), TxState.COMMIT if i % 2 else TxState.ROLLBACK, 1 if i % 2 else None)


def test_decisions_of_one_turn_share_a_record_per_partition_each_bounded() -> None:
    from txbridge.producer.asyncio import _MAX_BATCH, _OpBatches

    count = 2 * _MAX_BATCH + 7

    async def main() -> tuple[_RecordingPump, list[Decision], list[BaseException | None]]:
        pump = _RecordingPump()
        bridge = _bridge(pump)
        batches = _OpBatches(asyncio.get_running_loop(), bridge, _Settings(_encoder()))  # type: ignore[arg-type]
        decisions = [_decision(i) for i in range(count)]
        futures = [batches.submit(0, d) for d in decisions] + [batches.submit(5, _decision(1))]
        await asyncio.sleep(0)  # the end of the turn: the records are written
        for callback in pump.callbacks:
            callback(None, _Msg())
        acks = await asyncio.wait_for(asyncio.gather(*futures), 5)
        return pump, decisions, [ack.error for ack in acks]

    pump, decisions, errors = asyncio.run(main())
    assert errors == [None] * (count + 1)
    on_zero = [record for record in pump.records if record[0] == 0]
    assert [len(decode_ops(value)) for _, _, value in on_zero] == [_MAX_BATCH, _MAX_BATCH, 7]
    assert all(key is None for _, key, _ in on_zero)  # a batch has no key
    read = [op for _, _, value in on_zero for op in decode_ops(value)]
    expected = [(d.tx_id, d.state, d.messages) for d in decisions]
    assert [(op.tx_id, op.state, op.count) for op in read] == expected
    [(_, key, value)] = [record for record in pump.records if record[0] == 5]
    assert key is not None  # alone: the one-decision form
    assert decode_op(value).tx_id == key.decode()


def test_a_batch_that_cannot_be_written_raises_in_each_of_its_transactions() -> None:
    from txbridge.producer.asyncio import _OpBatches

    class Broken:
        def decisions(self, decisions: Any) -> Any:
            raise ValueError("cannot encode")

    async def main() -> list[BaseException | Any]:
        bridge = _bridge(FakePump())
        batches = _OpBatches(asyncio.get_running_loop(), bridge, _Settings(Broken()))  # type: ignore[arg-type]
        futures = [batches.submit(0, _decision(i)) for i in range(3)]
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)

    results = asyncio.run(main())
    assert [str(r) for r in results] == ["cannot encode"] * 3


def test_a_failed_batch_record_is_each_transactions_failure_and_a_cancelled_one_is_skipped() -> None:
    from txbridge.producer.asyncio import _OpBatches

    async def main() -> tuple[list[Any], bool]:
        pump = FakePump()
        bridge = _bridge(pump)
        batches = _OpBatches(asyncio.get_running_loop(), bridge, _Settings(_encoder()))  # type: ignore[arg-type]
        futures = [batches.submit(2, _decision(i)) for i in range(3)]
        futures[1].cancel()
        await asyncio.sleep(0)
        [callback] = pump.callbacks
        callback(KafkaError(KafkaError._MSG_TIMED_OUT), _Msg())
        acks = await asyncio.wait_for(asyncio.gather(futures[0], futures[2]), 5)
        return [ack.error for ack in acks], futures[1].cancelled()

    errors, cancelled = asyncio.run(main())
    assert cancelled
    assert all(isinstance(e, KafkaOperationError) for e in errors)
