"""The back-check client against httpx.MockTransport: signing, targets, verdict parsing, refusals."""

from __future__ import annotations

import time

import httpx
import pytest

from coordinator.checks.checker import Checker, CheckJob, CheckResult
from coordinator.config import CoordinatorConfig, Secrets
from txbridge.errors import SignatureError, WireFormatError
from txbridge.wire import (
    SIGNATURE_HEADER,
    CheckBatch,
    CheckRequest,
    TxState,
    decode_check_body,
    decode_check_request,
    verify,
)

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


@pytest.mark.parametrize("count", [1, 3], ids=["single", "batch"])
def test_a_check_that_reached_no_producer_is_not_an_answer(count: int) -> None:
    # A refused connection (a killed instance still inside its liveness, say) or an allow-list
    # refusal: nothing was asked, so nothing may use up max_checks.
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    results = make(handler).check_batch(jobs(count, "http://127.0.0.1:1/c", "http://10.0.0.8/c"))
    assert [(r.state, r.asked, r.refused) for r in results] == [(TxState.UNKNOWN, False, 1)] * count


@pytest.mark.parametrize("count", [1, 3], ids=["single", "batch"])
def test_a_check_that_reached_a_producer_and_failed_there_is_an_unknown_answer(count: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 1:
            raise httpx.ConnectError("refused", request=request)
        raise httpx.ReadTimeout("no answer in time", request=request)  # it got the request

    results = make(handler).check_batch(jobs(count, "http://127.0.0.1:1/c", "http://localhost:2/c"))
    assert [(r.state, r.asked) for r in results] == [(TxState.UNKNOWN, True)] * count


@pytest.mark.parametrize(
    "dropped",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("[Errno 104] Connection reset by peer"),
    ],
    ids=["closed", "reset"],
)
@pytest.mark.parametrize("count", [1, 3], ids=["single", "batch"])
def test_a_producer_that_dropped_the_check_without_a_response_did_not_answer(
    count: int, dropped: httpx.TransportError
) -> None:
    # A producer killed while it handled the check (the demo's planned crashes do this): no
    # answer came back, so the transaction is asked again soon, not after an UNKNOWN's backoff.
    def handler(request: httpx.Request) -> httpx.Response:
        raise type(dropped)(str(dropped), request=request)

    results = make(handler).check_batch(jobs(count, "http://127.0.0.1:1/c"))
    assert [(r.state, r.asked) for r in results] == [(TxState.UNKNOWN, False)] * count
    assert all(type(dropped).__name__ in r.detail for r in results)


def test_a_producer_killed_while_it_handles_the_check_did_not_answer() -> None:
    """On a real socket: the check server reads the request and its process dies (the kernel
    closes its connections) before it answers."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def die_while_checking() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.close()  # what the kernel does for a SIGKILLed process
        server.close()

    threading.Thread(target=die_while_checking, daemon=True).start()
    config = CoordinatorConfig(bootstrap="b:1", secrets=Secrets(default=SECRET.decode()))
    checker = Checker(config)
    checker.start()
    try:
        [result] = checker.check_batch([job(f"http://127.0.0.1:{port}/txbridge/check")])
    finally:
        checker.close()
    assert (result.state, result.asked) == (TxState.UNKNOWN, False), result.detail


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
    results = collect(checker, 3)
    assert sorted(r.job.request.group for r in results) == ["orders", "orders", "payments"]


def collect(checker: Checker, count: int) -> list[CheckResult]:
    """Results until ``count`` arrived (or 10 s passed); closes ``checker``."""
    deadline = time.monotonic() + 10
    results: list[CheckResult] = []
    while len(results) < count and time.monotonic() < deadline:
        results += checker.results()
        time.sleep(0.01)
    checker.close()
    return results


def jobs(count: int, *targets: str) -> list[CheckJob]:
    return [CheckJob(0, CheckRequest(f"tx-{i}", "orders", "inst-1", 1), targets) for i in range(count)]


def test_a_batch_is_one_signed_request_and_undecided_ones_go_to_the_next_target() -> None:
    seen: list[tuple[int | None, list[str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        verify(SECRET, request.headers[SIGNATURE_HEADER], request.content)
        batch = decode_check_body(request.content)
        assert isinstance(batch, CheckBatch)
        asked = [c.tx_id for c in batch.checks]
        seen.append((request.url.port, asked))
        if request.url.port == 1:  # the writer knows only the even ones
            states = {tx: "COMMIT" for tx in asked if int(tx[3:]) % 2 == 0}
        else:
            states = {tx: "ROLLBACK" for tx in asked}
        return httpx.Response(200, json={"states": states})

    results = make(handler).check_batch(jobs(5, "http://127.0.0.1:1/c", "http://127.0.0.1:2/c"))

    assert seen == [(1, ["tx-0", "tx-1", "tx-2", "tx-3", "tx-4"]), (2, ["tx-1", "tx-3"])]
    verdicts = {r.job.request.tx_id: (r.state, r.detail) for r in results}
    assert verdicts == {
        "tx-0": (TxState.COMMIT, "http://127.0.0.1:1/c"),
        "tx-2": (TxState.COMMIT, "http://127.0.0.1:1/c"),
        "tx-4": (TxState.COMMIT, "http://127.0.0.1:1/c"),
        "tx-1": (TxState.ROLLBACK, "http://127.0.0.1:2/c"),
        "tx-3": (TxState.ROLLBACK, "http://127.0.0.1:2/c"),
    }


def test_a_target_that_refuses_batches_is_asked_one_transaction_at_a_time_from_then_on() -> None:
    bodies: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        try:
            decode_check_request(request.content)
        except WireFormatError:
            return httpx.Response(400, json={"error": "not a check request"})
        return httpx.Response(200, json={"state": "COMMIT"})

    checker = make(handler)
    first = checker.check_batch(jobs(3, "http://127.0.0.1:9/c"))
    second = checker.check_batch(jobs(2, "http://127.0.0.1:9/c"))

    assert [r.state for r in first + second] == [TxState.COMMIT] * 5
    assert len(bodies) == 1 + 3 + 2  # one refused batch, then single requests only


def test_a_failed_batch_leaves_every_transaction_unknown() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    results = make(handler).check_batch(jobs(3, "http://127.0.0.1:9/c"))
    assert [r.state for r in results] == [TxState.UNKNOWN] * 3
    assert all("ReadTimeout" in r.detail for r in results)


def test_a_submitted_batch_counts_as_one_request_against_the_group_limit() -> None:
    release = []

    def handler(request: httpx.Request) -> httpx.Response:
        while not release:
            time.sleep(0.01)
        batch = decode_check_body(request.content)
        assert isinstance(batch, CheckBatch)
        return httpx.Response(200, json={"states": {c.tx_id: "COMMIT" for c in batch.checks}})

    checker = make(handler, check_concurrency_per_group=1)
    assert checker.submit_batch(jobs(4, "http://127.0.0.1:9/c"))
    assert checker.in_flight_txs == {"tx-0", "tx-1", "tx-2", "tx-3"}
    assert not checker.submit_batch(jobs(1, "http://127.0.0.1:9/c"))
    release.append(True)
    results = collect(checker, 4)
    assert sorted(r.job.request.tx_id for r in results) == ["tx-0", "tx-1", "tx-2", "tx-3"]
    assert {r.state for r in results} == {TxState.COMMIT}
    assert checker.in_flight_txs == set()


def test_a_running_answer_is_the_result_and_no_other_instance_is_asked_in_that_round() -> None:
    seen: list[int | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.port)
        batch = decode_check_body(request.content)
        assert isinstance(batch, CheckBatch)
        if request.url.port == 1:  # the writer: tx-0 still running here, the others unknown
            return httpx.Response(200, json={"states": {"tx-0": "RUNNING", "tx-1": "UNKNOWN"}})
        return httpx.Response(200, json={"states": {c.tx_id: "ROLLBACK" for c in batch.checks}})

    results = make(handler).check_batch(jobs(3, "http://127.0.0.1:1/c", "http://127.0.0.1:2/c"))

    assert seen == [1, 2]
    verdicts = {r.job.request.tx_id: (r.state, r.detail) for r in results}
    assert verdicts == {
        "tx-0": (TxState.RUNNING, "http://127.0.0.1:1/c"),
        "tx-1": (TxState.ROLLBACK, "http://127.0.0.1:2/c"),
        "tx-2": (TxState.ROLLBACK, "http://127.0.0.1:2/c"),
    }
