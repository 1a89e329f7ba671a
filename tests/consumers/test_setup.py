"""What both consumers share: set-up checks and settings (before any connection), the listener contract."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from txbridge.consumer import (
    ConcurrentConsumer,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
)
from txbridge.consumer._loop import call_listener
from txbridge.consumer.model import ConcurrentContext, ConsumedMessage
from txbridge.errors import ConfigurationError

BOOTSTRAP = "localhost:1"  # nothing listens there: constructors must not connect

CONSUMERS: list[tuple[type[Any], Any, str]] = [
    (OrderlyConsumer, lambda m, c: ConsumeOrderlyStatus.SUCCESS, "ConsumeOrderlyStatus"),
    (ConcurrentConsumer, lambda m, c: ConsumeConcurrentlyStatus.CONSUME_SUCCESS, "ConsumeConcurrentlyStatus"),
]
ids = [cls.__name__ for cls, _, _ in CONSUMERS]


@pytest.mark.parametrize(("cls", "listener", "status"), CONSUMERS, ids=ids)
def test_a_listener_that_is_not_callable_is_refused_naming_its_signature(
    cls: type[Any], listener: Any, status: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"listener must be callable: .* -> {status}"):
        cls(BOOTSTRAP, "g", "t", "not a function")


@pytest.mark.parametrize(("cls", "listener"), [c[:2] for c in CONSUMERS], ids=ids)
@pytest.mark.parametrize(
    ("args", "options", "says"),
    [
        (("", "t"), {}, "needs a group id"),
        (("g", []), {}, "at least one topic"),
        (("g", ["t", ""]), {}, "at least one topic"),
        (("g", "t"), {"subscription": "TAGA ||"}, "subscription expression"),
    ],
)
def test_shared_settings_are_checked_alike(
    cls: type[Any], listener: Any, args: tuple[str, Any], options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        cls(BOOTSTRAP, *args, listener, **options)


@pytest.mark.parametrize(("cls", "listener", "status"), CONSUMERS, ids=ids)
def test_shared_settings_are_applied_alike(cls: type[Any], listener: Any, status: str) -> None:
    consumer = cls(
        BOOTSTRAP,
        "billing",
        "orders",
        listener,
        subscription="TAGA || TAGB",
        namespace="shop",
        commit_interval_s=2.0,
        shutdown_timeout_s=5.0,
        extra_config={"session.timeout.ms": 6000},
    )
    assert consumer.topics == ["orders"]
    assert consumer.subscription.tags == {"TAGA", "TAGB"}
    assert consumer.dead_letter_topic == "shop_dlq-billing"
    assert not consumer.running


@pytest.mark.parametrize(("cls", "listener", "status"), CONSUMERS, ids=ids)
def test_an_unknown_setting_is_a_type_error(cls: type[Any], listener: Any, status: str) -> None:
    with pytest.raises(TypeError, match="subscripton"):
        cls(BOOTSTRAP, "g", "t", listener, subscripton="TAGA")


def test_each_consumer_keeps_its_own_settings() -> None:
    def listener(_m: Any, _c: Any) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS

    with pytest.raises(ConfigurationError, match="suspend_s"):
        OrderlyConsumer(BOOTSTRAP, "g", "t", listener, suspend_s=60.0, max_suspend_s=30.0)
    with pytest.raises(ConfigurationError, match="workers"):
        ConcurrentConsumer(BOOTSTRAP, "g", "t", listener, workers=0)
    concurrent = ConcurrentConsumer(BOOTSTRAP, "g", "t", listener, namespace="shop")
    assert concurrent.retry_topic == "shop_retry-g"


@pytest.mark.parametrize(
    ("answer", "succeeded", "logged"),
    [
        (ConsumeConcurrentlyStatus.CONSUME_SUCCESS, True, ""),
        (ConsumeConcurrentlyStatus.RECONSUME_LATER, False, ""),
        (None, False, "returned None, not a ConsumeConcurrentlyStatus; reconsuming later"),
        (ConsumeOrderlyStatus.SUCCESS, False, "not a ConsumeConcurrentlyStatus"),
        (RuntimeError("boom"), False, "raised on t/0@7 (attempt 2); reconsuming later"),
    ],
)
def test_the_listener_contract(
    answer: Any, succeeded: bool, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    def listener(_message: ConsumedMessage, _context: ConcurrentContext) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    message = ConsumedMessage("t", 0, 7, None, b"v", (), None, 0, 1, "t/0/7")
    with caplog.at_level(logging.WARNING, logger="txbridge.consumer"):
        result = call_listener(
            listener,
            message,
            ConcurrentContext(attempt=2),
            success=ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
            failure=ConsumeConcurrentlyStatus.RECONSUME_LATER,
            then="reconsuming later",
        )
    assert result is succeeded
    if logged:
        assert logged in caplog.text
    else:
        assert not caplog.records
