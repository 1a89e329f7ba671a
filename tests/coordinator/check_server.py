"""A tiny signed back-check endpoint for tests: verifies ``Txbridge-Signature``, answers as scripted.

Besides verdicts it misbehaves on demand, request by request (see :class:`Misbehaviour`):
slow answers, timeouts, error statuses, garbage bodies, dropped connections; and a
script may leave a transaction out of a batch answer (a partial answer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from txbridge.errors import SignatureError, WireFormatError
from txbridge.wire import (
    SIGNATURE_HEADER,
    CheckBatch,
    CheckRequest,
    TxState,
    decode_check_body,
    decode_check_request,
    encode_check_answer,
    encode_check_batch_answer,
    verify,
)

#: What the script returns for one transaction: a verdict; ``None`` to leave it out of a
#: batch answer (a single check answers UNKNOWN); or a raw ``(status, body)`` answer.
Answer = TxState | tuple[int, bytes] | None


@dataclass(frozen=True)
class Misbehaviour:
    """How one whole request is answered, whatever its transactions' verdicts.

    Attributes:
        delay_s: sleep this long before answering (longer than the coordinator's
            ``check_timeout_s``: a timeout; a little shorter: a slow answer).
        status: answer this HTTP status with ``body`` instead of the verdicts (None: the verdicts).
        body: the body of that answer (garbage, a wrong shape, ...).
        drop: close the connection without answering anything.
        trickle_s: send a 200 answer one byte every :data:`TRICKLE_INTERVAL_S` for this long,
            then close the connection: each read gets a byte long before any read timeout.
        trickle_body: send the status line and headers at once and trickle only the body
            (False: trickle from the status line on).
    """

    delay_s: float = 0.0
    status: int | None = None
    body: bytes = b""
    drop: bool = False
    trickle_s: float = 0.0
    trickle_body: bool = False


TRICKLE_INTERVAL_S = 0.2


#: ``misbehave(number, checks)``: the request's 1-based number among the verified, well-formed
#: ones and the transactions it asks about; returns how to misbehave, or None to answer properly.
MisbehaveScript = Callable[[int, Sequence[CheckRequest]], Misbehaviour | None]


@dataclass
class CheckServer:
    """Answers ``script(request)``; records every verified request and every rejected one.

    A batch is answered transaction by transaction, unless the script gives a raw answer for
    one of them: that raw answer is then the whole response. ``batches=False`` plays a
    producer that predates batches (a batch body is a 400), ``posts`` counts HTTP requests.
    ``misbehave`` runs first, per request (see :data:`MisbehaveScript`).
    """

    secret: bytes
    script: Callable[[CheckRequest], Answer] = lambda _req: TxState.UNKNOWN
    batches: bool = True
    misbehave: MisbehaveScript = lambda _number, _checks: None
    calls: list[CheckRequest] = field(default_factory=list)
    rejected: int = 0
    posts: int = 0
    requests: int = 0  # verified, well-formed requests: the numbers misbehave() sees
    batch_sizes: list[int] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/txbridge/check"

    def start(self) -> CheckServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with owner._lock:
                    owner.posts += 1
                try:
                    verify(owner.secret, self.headers.get(SIGNATURE_HEADER), body)
                except SignatureError:
                    with owner._lock:
                        owner.rejected += 1
                    self._answer(401, b'{"error":"bad signature"}')
                    return
                try:
                    parsed = decode_check_body(body) if owner.batches else decode_check_request(body)
                except WireFormatError:
                    with owner._lock:
                        owner.rejected += 1
                    self._answer(400, b'{"error":"not a check request"}')
                    return
                requests = parsed.checks if isinstance(parsed, CheckBatch) else (parsed,)
                with owner._lock:
                    owner.requests += 1
                    number = owner.requests
                    owner.batch_sizes.append(len(requests))
                    owner.calls.extend(requests)
                odd = owner.misbehave(number, requests)
                if odd is not None and self._misbehave(odd):
                    return
                answers = [owner.script(r) for r in requests]
                raw = [a for a in answers if isinstance(a, tuple)]
                if raw:
                    self._answer(*raw[0])
                elif isinstance(parsed, CheckBatch):
                    states = {
                        r.tx_id: a for r, a in zip(requests, answers, strict=True) if isinstance(a, TxState)
                    }
                    self._answer(200, encode_check_batch_answer(states))
                else:
                    verdict = answers[0] if isinstance(answers[0], TxState) else TxState.UNKNOWN
                    self._answer(200, encode_check_answer(verdict))

            def _misbehave(self, odd: Misbehaviour) -> bool:
                """Act out ``odd``; True when that was the whole answer."""
                if odd.delay_s:
                    time.sleep(odd.delay_s)
                if odd.trickle_s:
                    self._trickle(odd.trickle_s, odd.trickle_body)
                    return True
                if odd.drop:
                    self.close_connection = True
                    return True
                if odd.status is not None:
                    self._answer(odd.status, odd.body)
                    return True
                return False

            def _trickle(self, seconds: float, body_only: bool) -> None:
                size = 100_000  # more than the trickle sends
                head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
                raw, sent = head.encode() + b" " * size, 0
                self.close_connection = True
                end = time.monotonic() + seconds
                try:
                    if body_only:
                        self.wfile.write(raw[: len(head)])
                        sent = len(head)
                    while time.monotonic() < end:
                        self.wfile.write(raw[sent : sent + 1])
                        self.wfile.flush()
                        sent += 1
                        time.sleep(TRICKLE_INTERVAL_S)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the coordinator gave up: what it should do

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the coordinator gave up waiting (its timeout): nobody reads this answer

            def log_message(self, *_args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def calls_for(self, tx_id: str) -> list[CheckRequest]:
        with self._lock:
            return [c for c in self.calls if c.tx_id == tx_id]
