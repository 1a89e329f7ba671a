"""The back-check endpoint over real HTTP, against the producer's built-in server."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from txbridge import LocalTransaction, TransactionProducer, TxState, checkback, wire
from txbridge.checkback import CheckServer
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


# ---------------------------------------------------------------- replays inside the signature window


def without_id(body: bytes) -> bytes:
    """The body as a coordinator that predates request ids sends it."""
    return json.dumps(
        {k: v for k, v in json.loads(body).items() if k != "id"}, separators=(",", ":")
    ).encode()


def test_a_replayed_check_is_refused_and_user_code_runs_once(
    make_producer: Callable[..., TransactionProducer], caplog: pytest.LogCaptureFixture
) -> None:
    listener = RecordingListener(TxState.COMMIT)
    producer = make_producer(listener=listener)
    body = request_for(producer).encode()
    signature = wire.sign(SECRET, body)

    with caplog.at_level(logging.DEBUG, logger="txbridge"):
        first = post(producer.check_url, body, signature)
        replay = post(producer.check_url, body, signature)

    assert first.status_code == 200
    assert first.json() == {"state": "COMMIT"}
    assert replay.status_code == checkback.REPLAY_STATUS == 409
    assert "already answered" in replay.json()["error"]
    assert len(listener.checked) == 1
    # The coordinator reads the refusal as no answer: UNKNOWN, asked again later.
    assert wire.decode_check_answer(replay.status_code, replay.content) is TxState.UNKNOWN
    assert "refused a back-check" in caplog.text
    assert signature.split("v1=")[1] not in caplog.text
    assert SECRET.decode() not in caplog.text


def test_a_replayed_batch_is_refused_whole(make_producer: Callable[..., TransactionProducer]) -> None:
    listener = RecordingListener(TxState.ROLLBACK)
    producer = make_producer(listener=listener)
    requests = [request_for(producer) for _ in range(3)]
    body = wire.CheckBatch(producer.settings.group, tuple(requests)).encode()
    signature = wire.sign(SECRET, body)
    tx_ids = [r.tx_id for r in requests]

    first = post(producer.check_url, body, signature)
    replay = post(producer.check_url, body, signature)

    assert wire.decode_check_batch_answer(first.status_code, first.content, tx_ids) == dict.fromkeys(
        tx_ids, TxState.ROLLBACK
    )
    assert replay.status_code == 409  # not 400: a 400 would make the coordinator stop batching
    assert wire.decode_check_batch_answer(replay.status_code, replay.content, tx_ids) == dict.fromkeys(
        tx_ids, TxState.UNKNOWN
    )
    assert len(listener.checked) == 3


def test_the_same_check_encoded_twice_is_two_requests(
    make_producer: Callable[..., TransactionProducer],
) -> None:
    """The coordinator encodes each POST afresh: asking again about a transaction is no replay."""
    listener = RecordingListener(TxState.COMMIT)
    producer = make_producer(listener=listener)
    request = request_for(producer)

    answers = []
    for _ in range(2):
        body = request.encode()
        answers.append(post(producer.check_url, body, wire.sign(SECRET, body)))

    assert [a.status_code for a in answers] == [200, 200]
    assert [t.tx_id for t in listener.checked] == [request.tx_id, request.tx_id]


def test_copies_racing_in_together_are_answered_once(
    make_producer: Callable[..., TransactionProducer],
) -> None:
    calls: list[str] = []

    def slow_check(txn: LocalTransaction) -> TxState:
        calls.append(txn.tx_id)
        time.sleep(0.3)  # both copies arrive while the first is still being checked
        return TxState.COMMIT

    producer = make_producer(check=slow_check)
    body = request_for(producer).encode()
    signature = wire.sign(SECRET, body)
    with ThreadPoolExecutor(4) as pool:
        statuses = sorted(pool.map(lambda _: post(producer.check_url, body, signature).status_code, range(4)))

    assert statuses == [200, 409, 409, 409]
    assert len(calls) == 1


def test_a_check_without_id_is_answered_and_its_replay_refused(
    make_producer: Callable[..., TransactionProducer],
) -> None:
    """A coordinator that predates ids: remembered by what it signed (``<t>.`` + body)."""
    listener = RecordingListener(TxState.ROLLBACK)
    producer = make_producer(listener=listener)
    body = without_id(request_for(producer).encode())
    signature = wire.sign(SECRET, body)

    first = post(producer.check_url, body, signature)
    replay = post(producer.check_url, body, signature)
    # The same body signed at another second is a new request of that coordinator: answered.
    again = post(producer.check_url, body, wire.sign(SECRET, body, now=time.time() - 5))

    assert (first.status_code, first.json()) == (200, {"state": "ROLLBACK"})
    assert replay.status_code == 409
    assert (again.status_code, again.json()) == (200, {"state": "ROLLBACK"})
    assert len(listener.checked) == 2


def test_a_replay_after_the_window_is_stale_not_remembered() -> None:
    """Past the tolerance the signature check refuses a replay (401) before the memory is asked."""
    checked: list[str] = []

    def check(txn: LocalTransaction) -> TxState:
        checked.append(txn.tx_id)
        return TxState.COMMIT

    # Signatures carry whole seconds: a signature made at X.99 is already ~1 s old at once, so the
    # tolerance must leave room for that, and the wait must pass it by more than a second.
    server = CheckServer(checkback.build_check_app("orders", SECRET, check, tolerance_s=2))
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}{checkback.CHECK_PATH}"
        body = CheckRequest(wire.new_tx_id(), "orders", "i-1", 1).encode()
        signature = wire.sign(SECRET, body)
        first = post(url, body, signature)
        time.sleep(4.1)
        late = post(url, body, signature)
    finally:
        server.stop()

    assert first.status_code == 200
    assert late.status_code == 401
    assert "stale" in late.json()["error"]
    assert len(checked) == 1
