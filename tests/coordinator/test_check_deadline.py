"""A back-check request ends within ``check_timeout_s`` whatever the endpoint does.

httpx's timeouts are per phase and per read: an endpoint that trickles its answer a byte at a
time (its headers or its body) never trips them. Against a real HTTP server that does, a
check ends as UNKNOWN within the timeout, frees its slot, and the next answer decides.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from coordinator.checks.checker import Checker, CheckJob, CheckResult
from tests.coordinator.check_server import CheckServer, Misbehaviour
from tests.coordinator.conftest import Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic
from txbridge.wire import CheckRequest, TxState

pytestmark = pytest.mark.integration

TIMEOUT_S = 1.0
SLACK_S = 2.0  # the thread hand-over on a loaded machine; far below what a trickle lasts
TRICKLE_S = 30.0


@pytest.fixture
def checker(env: Env) -> Iterator[Checker]:
    checker = Checker(env.config(check_timeout_s=TIMEOUT_S, check_concurrency_per_group=1))
    checker.start()
    yield checker
    checker.close()


def _result(checker: Checker, timeout: float) -> list[CheckResult]:
    got: list[CheckResult] = []
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        got = checker.results()
        time.sleep(0.02)
    return got


@pytest.mark.parametrize("body_only", [False, True], ids=["headers", "body"])
def test_a_trickled_answer_ends_within_the_timeout_and_frees_the_slot(
    checker: Checker, check_server: CheckServer, body_only: bool
) -> None:
    check_server.script = lambda _request: TxState.COMMIT
    check_server.misbehave = lambda number, _checks: (
        Misbehaviour(trickle_s=TRICKLE_S, trickle_body=body_only) if number == 1 else None
    )
    job = CheckJob(0, CheckRequest("tx-1", "orders", "inst-1", 1), (check_server.url,))

    started = time.monotonic()
    assert checker.submit_batch([job])
    assert checker.free_slots("orders") == 0
    first = _result(checker, TRICKLE_S)
    took = time.monotonic() - started
    assert first, "the trickled check never ended"
    assert took < TIMEOUT_S + SLACK_S, f"the check took {took:.1f}s against a {TIMEOUT_S}s timeout"
    assert (first[0].state, first[0].asked) == (TxState.UNKNOWN, True)  # answered late: a timeout
    assert "Timeout" in first[0].detail
    assert checker.free_slots("orders") == 1

    assert checker.submit_batch([job])  # the slot is free: asked again, and the answer decides
    second = _result(checker, 10.0)
    assert [r.state for r in second] == [TxState.COMMIT]
    assert check_server.requests == 2


def test_a_transaction_whose_check_trickles_is_asked_again_and_published_once(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    env.producer.heartbeat(check_server.url)
    tx_id = env.producer.halves([Msg(topic, b"m", key=b"k")], check_after=0.2)[0]
    check_server.script = lambda _request: TxState.COMMIT
    check_server.misbehave = lambda number, _checks: (
        Misbehaviour(trickle_s=TRICKLE_S) if number == 1 else None
    )
    handle = env.start(check_timeout_s=TIMEOUT_S, check_concurrency_per_group=1, max_checks=5)

    def published() -> Counter[str]:
        return Counter(s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic))

    # Well before the trickle ends: the first check gave up at its timeout, the second decided.
    assert eventually(lambda: tx_id in published(), timeout=TRICKLE_S / 2), (
        f"not published; {check_server.requests} check requests, {handle.service.stats['checks']} checks"
    )
    assert published() == Counter({tx_id: 1})
    assert check_server.requests >= 2
    assert handle.service.stats["check_verdicts"] == 1
