"""The back-check client against httpx.MockTransport: signing, targets, verdict parsing, refusals."""

from __future__ import annotations

import time

import httpx
import pytest

from coordinator.checker import Checker, CheckJob
from coordinator.config import CoordinatorConfig, Secrets
from txbridge.errors import SignatureError
from txbridge.wire import SIGNATURE_HEADER, CheckRequest, TxState, decode_check_request, verify

SECRET = b"unit-secret"
REQUEST = CheckRequest("tx-1", "orders", "inst-1", 2)


def make(handler, **overrides) -> Checker:  # type: ignore[no-untyped-def]
    config = CoordinatorConfig(bootstrap="b:1", secrets=Secrets(default=SECRET.decode()), **overrides)
    checker = Checker(config, httpx.MockTransport(handler))
    checker.start()
    return checker


def job(*targets: str) -> CheckJob:
    return CheckJob(0, REQUEST, targets)


def test_request_is_signed_and_a_verdict_counts() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        verify(SECRET, request.headers[SIGNATURE_HEADER], request.content)
        return httpx.Response(200, json={"state": "COMMIT"})

    result = make(handler).check(job("http://127.0.0.1:9/check"))
    assert result.state is TxState.COMMIT
    assert decode_check_request(seen[0].content) == REQUEST
    with pytest.raises(SignatureError):
        verify(b"other", seen[0].headers[SIGNATURE_HEADER], seen[0].content)


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, json={"ok": True}),
        httpx.Response(200, content=b"COMMIT"),
        httpx.Response(200, json={"state": "commit"}),
        httpx.Response(500, json={"state": "COMMIT"}),
        httpx.Response(401, json={"state": "COMMIT"}),
    ],
)
def test_anything_but_an_explicit_verdict_is_unknown(response: httpx.Response) -> None:
    assert make(lambda _r: response).check(job("http://127.0.0.1:9/c")).state is TxState.UNKNOWN


def test_next_target_is_tried_when_the_first_fails() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"state": "ROLLBACK"})

    result = make(handler).check(job("http://127.0.0.1:1/c", "http://localhost:2/c"))
    assert (result.state, result.detail) == (TxState.ROLLBACK, "http://localhost:2/c")


def test_hosts_outside_the_allow_list_are_refused_without_a_request() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={"state": "COMMIT"})

    result = make(handler).check(job("http://10.0.0.8/c"))
    assert (result.state, result.refused, calls) == (TxState.UNKNOWN, 1, [])


def test_no_live_instance_and_no_secret_are_unknown() -> None:
    assert make(lambda _r: httpx.Response(200)).check(job()).state is TxState.UNKNOWN
    config = CoordinatorConfig(bootstrap="b:1")
    checker = Checker(config, httpx.MockTransport(lambda _r: httpx.Response(200, json={"state": "COMMIT"})))
    checker.start()
    assert checker.check(job("http://127.0.0.1:9/c")).state is TxState.UNKNOWN


def test_concurrency_per_group_is_bounded() -> None:
    release = []

    def handler(_request: httpx.Request) -> httpx.Response:
        while not release:
            time.sleep(0.01)
        return httpx.Response(200, json={"state": "COMMIT"})

    checker = make(handler, check_concurrency_per_group=2)
    assert checker.submit(job("http://127.0.0.1:9/c"))
    assert checker.submit(job("http://127.0.0.1:9/c"))
    assert not checker.submit(job("http://127.0.0.1:9/c"))
    other = CheckJob(0, CheckRequest("tx-2", "payments", "i", 1), ("http://127.0.0.1:9/c",))
    assert checker.submit(other)  # another group is not stalled
    release.append(True)
    deadline = time.monotonic() + 10
    results = []
    while len(results) < 3 and time.monotonic() < deadline:
        results += checker.results()
        time.sleep(0.01)
    checker.close()
    assert sorted(r.job.request.group for r in results) == ["orders", "orders", "payments"]
