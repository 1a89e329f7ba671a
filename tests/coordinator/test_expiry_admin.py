"""UNKNOWN forever: expiry to <ns>_expired, listed and resolved by ``txbridge admin``."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from cli.main import main
from coordinator.state.republisher import copy_aside
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.admin import list_expired
from txbridge.wire import HalfMessage, OpSource, TxState, decode_op

pytestmark = pytest.mark.integration


def test_unknown_forever_expires_and_admin_lists_and_commits_it(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    env.producer.heartbeat(check_server.url)  # answers UNKNOWN by default
    handle = env.start(max_checks=3)
    tx_id = env.producer.transaction(
        [Msg(topic, b"one", key=b"k", headers=(("trace", b"t1"),)), Msg(topic, b"two", key=b"k")],
        TxState.UNKNOWN,
    )

    expired = wait_for(env.bootstrap, env.topics.expired, 2)
    assert [(s.value, s.headers["txb.tx"], s.headers["txb.checks"]) for s in expired] == [
        (b"one", tx_id.encode(), b"3"),
        (b"two", tx_id.encode(), b"3"),
    ]
    assert b"3 back-checks" in expired[0].headers["txb.reason"]
    assert len(check_server.calls_for(tx_id)) == 3
    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []
    ops = [decode_op(s.value) for s in read_topic(env.bootstrap, env.topics.op)]
    assert [(o.state, o.source) for o in ops if o.tx_id == tx_id] == [(TxState.ROLLBACK, OpSource.EXPIRY)]

    runner = CliRunner()
    common = ["--bootstrap", env.bootstrap, "--namespace", env.namespace]
    listed = runner.invoke(main, ["admin", "expired", *common])
    assert listed.exit_code == 0, listed.output
    assert tx_id in listed.output
    assert "orders" in listed.output
    assert topic in listed.output

    resolved = runner.invoke(main, ["admin", "resolve", tx_id, "--commit", *common])
    assert resolved.exit_code == 0, resolved.output
    seen = wait_for(env.bootstrap, topic, 2)
    assert [(s.key, s.value) for s in seen] == [(b"k", b"one"), (b"k", b"two")]
    assert seen[0].headers == {"trace": b"t1", "txb.tx": tx_id.encode()}

    again = runner.invoke(main, ["admin", "resolve", tx_id, "--rollback", *common])
    assert again.exit_code == 2
    assert f"transaction {tx_id} was already resolved COMMIT by an admin" in again.output
    after = runner.invoke(main, ["admin", "expired", *common])
    assert "resolved COMMIT" in next(line for line in after.output.splitlines() if tx_id in line)
    # The coordinator reads the admin op back and changes nothing.
    assert eventually(lambda: handle.service.stats["admin_ops"] == 1)
    assert len(read_topic(env.bootstrap, topic)) == 2


def test_admin_resolve_of_an_unknown_tx_says_so(env: Env) -> None:
    result = CliRunner().invoke(
        main,
        [
            "admin",
            "resolve",
            "nope",
            "--rollback",
            "--bootstrap",
            env.bootstrap,
            "--namespace",
            env.namespace,
        ],
    )
    assert result.exit_code == 2
    assert "is not in" in result.output


def test_an_expiry_still_being_committed_is_listed_when_the_listing_waits_for_open_ones(env: Env) -> None:
    """The expiry resumer lists with ``wait_for_open``: a group that returns while an expiry of
    it is in the coordinator's still-open Kafka transaction is asked about it; the admin listing
    shows only what is committed."""
    producer = kafka.producer(env.bootstrap, {}, transactional_id=f"{env.namespace}-expiring")
    kafka.init_transactions(producer, 30)
    producer.begin_transaction()
    half = HalfMessage("tx-expiring", 0, "orders", b"v", key=b"k", group="orders", instance="inst-1")
    out = copy_aside(env.topics.expired, half, "no decision after 2 back-checks", f"{env.topics.half}/0/5", 2)
    producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers)
    producer.flush(30)

    assert [e.tx_id for e in list_expired(env.bootstrap, env.namespace)] == []  # not committed yet
    timer = threading.Timer(1.5, lambda: producer.commit_transaction(30))
    timer.start()
    try:
        listed = list_expired(env.bootstrap, env.namespace, wait_for_open=True)
    finally:
        timer.join()
    assert [(e.tx_id, e.group, e.partition, e.first_offset) for e in listed] == [
        ("tx-expiring", "orders", 0, 5)
    ]
