"""Expired transactions re-checked when their group comes back: published once, in order."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner

from cli.main import main
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import CheckRequest, TxState

pytestmark = pytest.mark.integration


def _expire(env: Env, check_server: CheckServer, messages: list[list[Msg]], **config: object) -> tuple:
    """Transactions left UNKNOWN until they expire (max_checks 2); returns (handle, tx ids)."""
    env.producer.heartbeat(check_server.url)  # inst-1 answers UNKNOWN by default
    handle = env.start(max_checks=2, **config)
    tx_ids = [env.producer.transaction(m, TxState.UNKNOWN) for m in messages]
    assert eventually(lambda: handle.service.stats["resolved_expired"] == len(tx_ids), timeout=60)
    return handle, tx_ids


def test_expired_transactions_are_published_when_their_group_comes_back(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    handle, (first, second, rolled) = _expire(
        env,
        check_server,
        [
            [Msg(topic, b"k-1", key=b"k")],
            [Msg(topic, b"k-2", key=b"k"), Msg(topic, b"k-3", key=b"k")],
            [Msg(topic, b"never", key=b"other")],
        ],
    )
    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []

    # The group comes back (a new instance heartbeats); its database now answers decisively.
    answers = {first: TxState.COMMIT, second: TxState.COMMIT, rolled: TxState.ROLLBACK}
    check_server.script = lambda req: answers[req.tx_id]
    env.producer.heartbeat(check_server.url, instance="inst-2")

    seen = wait_for(env.bootstrap, topic, 3)
    assert eventually(lambda: handle.service.stats["expired_rolled_back"] == 1)

    assert [(s.key, s.value) for s in seen] == [(b"k", b"k-1"), (b"k", b"k-2"), (b"k", b"k-3")]
    assert [s.headers["txb.tx"] for s in seen] == [first.encode(), second.encode(), second.encode()]
    # The loop counts what the resumer did once a second.
    assert eventually(lambda: handle.service.stats["expired_resumed"] == 2)
    assert handle.service.stats["expired_rechecked"] == 3
    listed = CliRunner().invoke(
        main, ["admin", "expired", "--bootstrap", env.bootstrap, "--namespace", env.namespace]
    )
    assert listed.exit_code == 0, listed.output
    lines = {tx: next(line for line in listed.output.splitlines() if tx in line) for tx in answers}
    assert "resolved COMMIT" in lines[first]
    assert "resolved ROLLBACK" in lines[rolled]

    # Once resolved, a later return of the group asks nothing again, and publishes nothing twice.
    asked = len(check_server.calls)
    env.producer.heartbeat(check_server.url, instance="inst-3")
    assert not eventually(lambda: len(check_server.calls) > asked, timeout=5)
    assert len(read_topic(env.bootstrap, topic)) == 3


def test_an_expired_transaction_still_undecided_waits_for_the_next_return(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    handle, (tx_id,) = _expire(env, check_server, [[Msg(topic, b"v", key=b"k")]])

    env.producer.heartbeat(check_server.url, instance="inst-2")  # still UNKNOWN
    assert eventually(lambda: handle.service.stats["expired_rechecked"] == 1)
    check_server.script = lambda _req: TxState.COMMIT
    env.producer.heartbeat(check_server.url, instance="inst-3")

    seen = wait_for(env.bootstrap, topic, 1)
    assert [s.headers["txb.tx"] for s in seen] == [tx_id.encode()]
    assert eventually(lambda: handle.service.stats["expired_resumed"] == 1)
    assert handle.service.stats["expired_rechecked"] == 2


def test_resume_can_be_turned_off(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    handle, _ = _expire(env, check_server, [[Msg(topic, b"v")]], resume_expired=False)
    calls: list[CheckRequest] = []
    check_server.script = lambda req: calls.append(req) or TxState.COMMIT
    env.producer.heartbeat(check_server.url, instance="inst-2")

    assert not eventually(lambda: calls, timeout=5)
    assert handle.service.stats["expired_rechecked"] == 0
    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []
