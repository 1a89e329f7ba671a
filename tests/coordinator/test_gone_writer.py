"""A writer that went silent: its transactions are checked at once against a decisive instance."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from coordinator.checks.registry import RegistryView
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import ProducerInstance, TxState


def _beat(view: RegistryView, name: str, seen: int, *, interval: float = 1.0, decisive: bool = True) -> None:
    record = ProducerInstance("g", name, f"http://127.0.0.1/{name}", interval_s=interval, decisive=decisive)
    view.apply(record.key(), record.encode(), seen)


def test_an_instance_unheard_for_two_and_a_half_intervals_is_silent_and_asked_last() -> None:
    view = RegistryView(liveness_s=10)
    _beat(view, "a", 1_000)
    _beat(view, "b", 3_000)
    _beat(view, "old", 1_000, interval=0.0, decisive=False)  # an older producer: says neither

    assert view.silent(3_400) == set()
    assert view.silent(3_600) == {("g", "a")}  # 2.6 s since a's beat at a 1 s interval
    assert view.targets("g", "a", None, 3_600) == [
        "http://127.0.0.1/b",
        "http://127.0.0.1/old",
        "http://127.0.0.1/a",
    ]
    assert view.targets("g", "a", None, 3_400)[0] == "http://127.0.0.1/a"  # the writer first while heard
    assert view.decisive_elsewhere("g", "a", 3_600)
    assert not view.decisive_elsewhere("g", "b", 3_600)  # a is silent, old is not decisive


def test_a_decisive_instance_that_left_is_reported_once() -> None:
    view = RegistryView(liveness_s=10)
    _beat(view, "a", 1_000)
    _beat(view, "plain", 1_000, decisive=False)
    view.apply(b"g/a", None, 2_000)
    view.apply(b"g/plain", None, 2_000)
    assert view.left == {("g", "a")}


@pytest.mark.integration
@pytest.mark.parametrize("decisive", [True, False], ids=["decisive", "ordinary-check"])
def test_a_silent_writers_transaction_is_checked_before_the_check_delay_only_when_decisive(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], decisive: bool
) -> None:
    topic = topic_factory()
    check_server.script = lambda _req: TxState.COMMIT
    # inst-1 writes and dies (one heartbeat, then silence); inst-2 of the same group stays up.
    env.producer.heartbeat(check_server.url, instance="inst-1", interval_s=0.5, decisive=decisive)
    stop = threading.Event()

    def keep_beating() -> None:
        while not stop.wait(0.5):
            env.producer.heartbeat(check_server.url, instance="inst-2", interval_s=0.5, decisive=decisive)

    beating = threading.Thread(target=keep_beating, daemon=True)
    beating.start()
    try:
        handle = env.start(check_delay_s=60.0)
        tx_id = env.producer.transaction([Msg(topic, b"v", key=b"k")], TxState.UNKNOWN)

        if decisive:
            seen = wait_for(env.bootstrap, topic, 1, timeout=30)  # the check delay alone: 60 s
            assert [s.headers["txb.tx"] for s in seen] == [tx_id.encode()]
            assert handle.service.stats["checks_expedited"] == 1
            assert check_server.calls_for(tx_id)
        else:
            assert not eventually(lambda: check_server.calls_for(tx_id), timeout=8)
            assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []
            assert handle.service.stats["checks_expedited"] == 0
    finally:
        stop.set()
        beating.join(5)
