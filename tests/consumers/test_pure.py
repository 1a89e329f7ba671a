"""Pure logic of the consumers: tag expressions, the retry schedule, offset tracking, selectors."""

from __future__ import annotations

import pytest

from txbridge.consumer import RetryPolicy, parse_subscription
from txbridge.consumer.dlq import parse_origin
from txbridge.consumer.offsets import OffsetTracker
from txbridge.consumer.retry import ROCKETMQ_DELAYS_S
from txbridge.consumer.tags import tag_of, validate_tag
from txbridge.errors import ConfigurationError, WireFormatError
from txbridge.ordered import OrderedMessage, hash_selector, select_partition
from txbridge.wire import H_TAGS

# ---------------------------------------------------------------- tags


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", frozenset()),
        ("  *  ", frozenset()),
        ("TAGA", {"TAGA"}),
        ("TAGA||TAGB", {"TAGA", "TAGB"}),
        ("  TAGA ||   TAGB || TAG-C.1:x ", {"TAGA", "TAGB", "TAG-C.1:x"}),
    ],
)
def test_subscription_expressions_parse(expression: str, tags: set[str]) -> None:
    assert parse_subscription(expression).tags == tags


@pytest.mark.parametrize(
    ("tag", "expression", "expected"),
    [
        (None, "*", True),
        ("TAGX", "*", True),
        ("TAGA", "TAGA || TAGB", True),
        ("TAGB", "TAGA || TAGB", True),
        ("TAGC", "TAGA || TAGB", False),
        (None, "TAGA", False),
        ("taga", "TAGA", False),  # tags are case-sensitive, as in RocketMQ
    ],
)
def test_subscription_matches_exactly(tag: str | None, expression: str, expected: bool) -> None:
    assert parse_subscription(expression).matches(tag) is expected


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("TAGA ||", "empty tag"),
        ("||", "empty tag"),
        ("|| TAGA", "empty tag"),
        ("TAGA |||| TAGB", "empty tag"),
        ("TAGA | TAGB", "illegal character"),
        ("TAG A", "illegal character"),
        ("TAGA && TAGB", "illegal character"),
        ("TAGA || *", "'*' must stand alone"),
        ("TAG*", "illegal character"),
    ],
)
def test_malformed_expressions_are_configuration_errors(expression: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_subscription(expression)


def test_tag_header_is_read_and_bad_utf8_is_a_wire_error() -> None:
    assert tag_of([("x", b"1"), (H_TAGS, b"TAGA")]) == "TAGA"
    assert tag_of([("x", b"1")]) is None
    assert tag_of([(H_TAGS, b"")]) is None
    with pytest.raises(WireFormatError, match=H_TAGS):
        tag_of([(H_TAGS, b"\xff\xfe")])
    assert validate_tag("TAGA") == "TAGA"
    with pytest.raises(ConfigurationError):
        validate_tag("TAGA || TAGB")


# ---------------------------------------------------------------- retry schedule


def test_default_schedule_is_rocketmqs_levels() -> None:
    policy = RetryPolicy()
    assert [policy.delay_for(n) for n in (1, 2, 3, 13, 16)] == [10, 30, 60, 1200, 7200]
    assert len(ROCKETMQ_DELAYS_S) == 16
    assert policy.max_reconsume == 16
    assert policy.delay_for(40) == 7200  # past the end, the last delay repeats


def test_exhaustion_and_due_time_never_early() -> None:
    policy = RetryPolicy(delays_s=[0.5, 1.0], max_reconsume=2)
    assert not policy.exhausted(0)
    assert not policy.exhausted(1)
    assert policy.exhausted(2)
    assert policy.due_ms(1, 100.0001) == 100_501  # rounded up
    assert policy.due_ms(2, 100.0) == 101_000
    with pytest.raises(ValueError, match="start at 1"):
        policy.delay_for(0)


@pytest.mark.parametrize("kwargs", [{"delays_s": []}, {"delays_s": [1, -1]}, {"max_reconsume": -1}])
def test_bad_policies_fail_fast(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- offsets


def test_commit_stops_below_the_lowest_unfinished_offset() -> None:
    tracker = OffsetTracker()
    assert tracker.committable() is None
    for offset in (5, 6, 7, 8):
        tracker.start(offset)
    assert tracker.committable() == 5
    tracker.finish(6)
    tracker.finish(8)
    assert tracker.committable() == 5  # 5 and 7 unfinished
    tracker.finish(5)
    assert tracker.committable() == 7
    tracker.finish(7)
    assert tracker.committable() == 9
    assert tracker.in_flight == 0


def test_to_commit_only_reports_moves() -> None:
    tracker = OffsetTracker()
    tracker.start(0)
    tracker.finish(0)
    assert tracker.to_commit() == 1
    tracker.committed(1)
    assert tracker.to_commit() is None
    tracker.start(1)
    assert tracker.to_commit() is None  # 1 is unfinished: nothing new to commit
    tracker.finish(1)
    assert tracker.to_commit() == 2


def test_origin_header_parses() -> None:
    assert parse_origin("orders/3/1200") == ("orders", 3, 1200)
    for bad in ("orders", "orders/x/1", "/1/2", "orders/1/"):
        with pytest.raises(WireFormatError):
            parse_origin(bad)


# ---------------------------------------------------------------- selectors


def test_hash_selector_is_kafkas_partitioner() -> None:
    # Values from Kafka's Java client: Utils.toPositive(Utils.murmur2(key)) % n.
    message = OrderedMessage("t", b"v", key=b"21")
    assert hash_selector(message, None, 12) == (-973932308 & 0x7FFFFFFF) % 12
    assert select_partition(OrderedMessage("t", b"v", key=None), 7, arg="order-1") == select_partition(
        OrderedMessage("t", b"v", key=b"order-1"), 7
    )


def test_selector_errors_are_clear() -> None:
    with pytest.raises(ConfigurationError, match="needs a key"):
        select_partition(OrderedMessage("t", b"v"), 3)
    with pytest.raises(ConfigurationError, match="must be an int"):
        select_partition(OrderedMessage("t", b"v"), 3, selector=lambda m, a, n: n)
    assert select_partition(OrderedMessage("t", b"v"), 3, selector=lambda m, a, n: a % n, arg=7) == 1


def test_public_surface_is_pinned() -> None:
    import txbridge.consumer

    assert sorted(txbridge.consumer.__all__) == [
        "ConcurrentConsumer",
        "ConcurrentContext",
        "ConsumeConcurrentlyStatus",
        "ConsumeOrderlyStatus",
        "ConsumedMessage",
        "OrderlyConsumer",
        "OrderlyContext",
        "ROCKETMQ_DELAYS_S",
        "RetryPolicy",
        "Subscription",
        "parse_subscription",
    ]
