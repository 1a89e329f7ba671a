"""The back-check endpoint over real HTTP, against the producer's built-in server."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from txbridge import LocalTransaction, TransactionProducer, TxState, wire
from txbridge.wire import CheckMessage, CheckRequest

from .conftest import SECRET

pytestmark = pytest.mark.integration


class RecordingListener:
    """A listener that remembers every check it answered."""

    def __init__(self, answer: TxState | Exception = TxState.COMMIT) -> None:
        self.answer = answer
        self.checked: list[LocalTransaction] = []

    def execute_local_transaction(self, txn: LocalTransaction, arg: Any) -> TxState:
        return TxState.COMMIT

    def check_local_transaction(self, txn: LocalTransaction) -> TxState:
        self.checked.append(txn)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def request_for(producer: TransactionProducer, **overrides: Any) -> CheckRequest:
    fields: dict[str, Any] = {
        "tx_id": wire.new_tx_id(),
        "group": producer.settings.group,
        "instance": producer.instance_id,
        "attempt": 2,
        "messages": (CheckMessage("orders", b"customer-7", (("trace", b"abc"), ("txb.seq", b"0"))),),
    }
    fields.update(overrides)
    return CheckRequest(**fields)


def post(url: str, body: bytes, signature: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers[wire.SIGNATURE_HEADER] = signature
    return httpx.post(url, content=body, headers=headers, timeout=10)


@pytest.mark.parametrize("answer", [TxState.COMMIT, TxState.ROLLBACK, TxState.UNKNOWN])
def test_signed_check_reaches_the_listener(
    make_producer: Callable[..., TransactionProducer], answer: TxState
) -> None:
    listener = RecordingListener(answer)
    producer = make_producer(listener=listener)
    request = request_for(producer)
    body = request.encode()

    response = post(producer.check_url, body, wire.sign(SECRET, body))

    assert response.status_code == 200
    assert response.json() == {"state": answer.value}
    assert wire.decode_check_answer(response.status_code, response.content) is answer
    [txn] = listener.checked
    assert (txn.tx_id, txn.group, txn.attempt) == (request.tx_id, request.group, 2)
    [message] = txn.messages
    assert (message.topic, message.key, message.value) == ("orders", b"customer-7", None)
    assert message.headers == (("trace", b"abc"),)  # protocol headers are not the user's


@pytest.mark.parametrize(
    "signature",
    [
        None,  # unsigned
        "garbage",
        "t=123",  # no v1
        "wrong-secret",
        "stale",
        "other-body",
    ],
)
def test_bad_signature_is_401_and_user_code_never_runs(
    make_producer: Callable[..., TransactionProducer], signature: str | None
) -> None:
    listener = RecordingListener()
    producer = make_producer(listener=listener)
    body = request_for(producer).encode()
    header = {
        "wrong-secret": wire.sign(b"not-the-secret", body),
        "stale": wire.sign(SECRET, body, now=time.time() - 3600),
        "other-body": wire.sign(SECRET, body + b" "),
    }.get(signature or "", signature)

    response = post(producer.check_url, body, header)

    assert response.status_code == 401
    assert "error" in response.json()
    assert listener.checked == []


def test_signature_is_checked_before_parsing(make_producer: Callable[..., TransactionProducer]) -> None:
    listener = RecordingListener()
    producer = make_producer(listener=listener)
    # Not JSON at all, unsigned: 401, not 400 — nothing is parsed without a signature.
    assert post(producer.check_url, b"{not json", None).status_code == 401
    # Signed but not a check request: 400.
    response = post(producer.check_url, b"{not json", wire.sign(SECRET, b"{not json"))
    assert response.status_code == 400
    assert listener.checked == []


def test_check_of_another_group_is_refused(make_producer: Callable[..., TransactionProducer]) -> None:
    listener = RecordingListener()
    producer = make_producer(listener=listener)
    body = request_for(producer, group="someone-else").encode()
    response = post(producer.check_url, body, wire.sign(SECRET, body))
    assert response.status_code == 404
    assert listener.checked == []


def test_raising_check_answers_unknown_and_logs_no_secret(
    make_producer: Callable[..., TransactionProducer], caplog: pytest.LogCaptureFixture
) -> None:
    listener = RecordingListener(RuntimeError("db down"))
    producer = make_producer(listener=listener)
    body = request_for(producer).encode()
    with caplog.at_level(logging.DEBUG, logger="txbridge"):
        response = post(producer.check_url, body, wire.sign(SECRET, body))
    assert response.status_code == 200
    assert response.json() == {"state": "UNKNOWN"}
    assert len(listener.checked) == 1
    assert "RuntimeError" in caplog.text
    logged = caplog.text
    assert SECRET.decode() not in logged
    assert base64.b64encode(SECRET).decode() not in logged
    assert SECRET.decode() not in repr(producer.settings)


def test_check_function_and_async_check(make_producer: Callable[..., TransactionProducer]) -> None:
    seen: list[str] = []

    async def check(txn: LocalTransaction) -> TxState:
        seen.append(txn.tx_id)
        return TxState.ROLLBACK

    producer = make_producer(check=check)
    request = request_for(producer)
    body = request.encode()
    response = post(producer.check_url, body, wire.sign(SECRET, body))
    assert response.json() == {"state": "ROLLBACK"}
    assert seen == [request.tx_id]


def test_only_post_on_the_check_path(make_producer: Callable[..., TransactionProducer]) -> None:
    producer = make_producer()
    assert httpx.get(producer.check_url, timeout=10).status_code == 405
    other = producer.check_url.replace("/txbridge/check", "/elsewhere")
    assert httpx.post(other, content=b"{}", timeout=10).status_code == 404


def test_a_batch_is_answered_per_transaction_and_one_failure_stays_its_own(
    make_producer: Callable[..., TransactionProducer],
) -> None:
    verdicts: dict[str, TxState | Exception] = {}
    checked: list[str] = []

    def check(txn: LocalTransaction) -> TxState:
        checked.append(txn.tx_id)
        answer = verdicts[txn.tx_id]
        if isinstance(answer, Exception):
            raise answer
        return answer

    producer = make_producer(check=check)
    requests = [request_for(producer) for _ in range(4)]
    answers: list[TxState | Exception] = [
        TxState.COMMIT,
        RuntimeError("db down"),
        TxState.ROLLBACK,
        TxState.UNKNOWN,
    ]
    verdicts.update({r.tx_id: a for r, a in zip(requests, answers, strict=True)})
    body = wire.CheckBatch(producer.settings.group, tuple(requests)).encode()

    response = post(producer.check_url, body, wire.sign(SECRET, body))

    assert response.status_code == 200
    states = wire.decode_check_batch_answer(200, response.content, [r.tx_id for r in requests])
    assert [states[r.tx_id] for r in requests] == [
        TxState.COMMIT,
        TxState.UNKNOWN,
        TxState.ROLLBACK,
        TxState.UNKNOWN,
    ]
    assert checked == [r.tx_id for r in requests]


def test_an_async_check_answers_a_batch(make_producer: Callable[..., TransactionProducer]) -> None:
    async def check(txn: LocalTransaction) -> TxState:
        return TxState.COMMIT if txn.attempt == 2 else TxState.ROLLBACK

    producer = make_producer(check=check)
    requests = [request_for(producer), request_for(producer, attempt=5)]
    body = wire.CheckBatch(producer.settings.group, tuple(requests)).encode()

    response = post(producer.check_url, body, wire.sign(SECRET, body))

    assert response.json() == {"states": {requests[0].tx_id: "COMMIT", requests[1].tx_id: "ROLLBACK"}}


@pytest.mark.parametrize("problem", ["unsigned", "other-group", "too-many"])
def test_a_bad_batch_runs_no_user_code(
    make_producer: Callable[..., TransactionProducer], problem: str
) -> None:
    listener = RecordingListener()
    producer = make_producer(listener=listener)
    count = wire.MAX_CHECK_BATCH + 1 if problem == "too-many" else 2
    group = "someone-else" if problem == "other-group" else producer.settings.group
    body = wire.CheckBatch(group, tuple(request_for(producer, group=group) for _ in range(count))).encode()

    response = post(producer.check_url, body, None if problem == "unsigned" else wire.sign(SECRET, body))

    assert response.status_code == {"unsigned": 401, "other-group": 404, "too-many": 400}[problem]
    assert "error" in response.json()
    assert listener.checked == []
