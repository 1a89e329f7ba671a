"""Bad input is quarantined with its reason, and the coordinator keeps serving other transactions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.coordinator.conftest import Env
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def test_malformed_records_are_quarantined_and_others_still_commit(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    env.start(check_delay_s=30.0)
    half, op = env.topics.half, env.topics.op
    env.producer.raw(half, 0, b"tx-x", b"no headers", [("txb.v", b"1"), ("custom", b"kept")])
    env.producer.raw(op, 1, b"tx-y", b"{not json")
    env.producer.raw(op, 2, b"tx-z", b'{"v":1,"tx":"tx-z","state":"MAYBE","source":"producer"}')
    good = [env.producer.transaction([Msg(topic, f"ok{i}".encode())], TxState.COMMIT) for i in range(6)]

    quarantined = wait_for(env.bootstrap, env.topics.quarantine, 3)
    seen = wait_for(env.bootstrap, topic, 6)

    by_origin = {s.headers["txb.origin"].decode(): s for s in quarantined}
    assert set(by_origin) == {f"{half}/0/0", f"{op}/1/0", f"{op}/2/0"}
    lacking = by_origin[f"{half}/0/0"]
    assert (lacking.key, lacking.value, lacking.headers["custom"]) == (b"tx-x", b"no headers", b"kept")
    assert b"lacks required headers" in lacking.headers["txb.reason"]
    assert b"not JSON" in by_origin[f"{op}/1/0"].headers["txb.reason"]
    assert by_origin[f"{op}/1/0"].value == b"{not json"
    assert b"MAYBE" in by_origin[f"{op}/2/0"].headers["txb.reason"]
    assert sorted(s.headers["txb.tx"] for s in seen) == sorted(t.encode() for t in good)


def test_oversized_committed_message_is_quarantined_without_blocking(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    handle = env.start(check_delay_s=30.0, max_message_bytes=10_000)
    big = env.producer.transaction(
        [Msg(topic, b"small", key=b"same"), Msg(topic, b"x" * 20_000, key=b"same")], TxState.COMMIT
    )
    after = env.producer.transaction([Msg(topic, b"after", key=b"same")], TxState.COMMIT)

    seen = wait_for(env.bootstrap, topic, 1)
    quarantined = wait_for(env.bootstrap, env.topics.quarantine, 2)

    assert [s.headers["txb.tx"] for s in seen] == [after.encode()]
    assert {s.headers["txb.tx"] for s in quarantined} == {big.encode()}
    assert all(b"above max_message_bytes=10000" in s.headers["txb.reason"] for s in quarantined)
    assert sorted(len(s.value) for s in quarantined) == [5, 20_000]
    assert handle.service.stats["resolved_quarantined"] == 1
    assert len(read_topic(env.bootstrap, topic, isolation="read_uncommitted")) == 1


def test_message_the_broker_rejects_is_quarantined_without_blocking(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    small = topic_factory(config={"max.message.bytes": "4000"})
    other = topic_factory()
    handle = env.start(check_delay_s=30.0)
    before = env.producer.transaction([Msg(other, b"before", key=b"k")], TxState.COMMIT)
    rejected = env.producer.transaction(
        [Msg(other, b"first half of it", key=b"k"), Msg(small, b"y" * 9000, key=b"k")], TxState.COMMIT
    )
    after = env.producer.transaction([Msg(other, b"after", key=b"k")], TxState.COMMIT)

    seen = wait_for(env.bootstrap, other, 2)
    quarantined = wait_for(env.bootstrap, env.topics.quarantine, 2)

    assert [s.headers["txb.tx"] for s in seen] == [before.encode(), after.encode()]
    assert {s.headers["txb.tx"] for s in quarantined} == {rejected.encode()}
    assert b"rejected" in quarantined[0].headers["txb.reason"]
    assert read_topic(env.bootstrap, small) == []
    assert handle.service.stats["kafka_aborts"] >= 1
