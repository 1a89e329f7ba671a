"""The asyncio producer's delivery bridge without a broker: batching, failures, deadlines."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from txbridge.delivery import DeliveryPump
from txbridge.errors import KafkaOperationError, TransactionStateError
from txbridge.producer.asyncio import _AckBridge


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
