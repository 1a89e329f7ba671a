"""A tiny signed back-check endpoint for tests: verifies ``Txbridge-Signature``, answers as scripted."""

from __future__ import annotations

import threading
from collections.abc import Callable
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

#: What the script returns: a verdict, or a raw ``(status, body)`` answer.
Answer = TxState | tuple[int, bytes]


@dataclass
class CheckServer:
    """Answers ``script(request)``; records every verified request and every rejected one.

    A batch is answered transaction by transaction, unless the script gives a raw answer for
    one of them: that raw answer is then the whole response. ``batches=False`` plays a
    producer that predates batches (a batch body is a 400), ``posts`` counts HTTP requests.
    """

    secret: bytes
    script: Callable[[CheckRequest], Answer] = lambda _req: TxState.UNKNOWN
    batches: bool = True
    calls: list[CheckRequest] = field(default_factory=list)
    rejected: int = 0
    posts: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/txbridge/check"

    def start(self) -> CheckServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.posts += 1
                try:
                    verify(owner.secret, self.headers.get(SIGNATURE_HEADER), body)
                except SignatureError:
                    owner.rejected += 1
                    self._answer(401, b'{"error":"bad signature"}')
                    return
                try:
                    parsed = decode_check_body(body) if owner.batches else decode_check_request(body)
                except WireFormatError:
                    owner.rejected += 1
                    self._answer(400, b'{"error":"not a check request"}')
                    return
                requests = parsed.checks if isinstance(parsed, CheckBatch) else (parsed,)
                owner.batch_sizes.append(len(requests))
                owner.calls.extend(requests)
                answers = [owner.script(r) for r in requests]
                raw = [a for a in answers if not isinstance(a, TxState)]
                if raw:
                    self._answer(*raw[0])
                elif isinstance(parsed, CheckBatch):
                    states = {r.tx_id: a for r, a in zip(requests, answers, strict=True)}
                    self._answer(200, encode_check_batch_answer(states))  # type: ignore[arg-type]
                else:
                    self._answer(200, encode_check_answer(answers[0]))  # type: ignore[arg-type]

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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
        return [c for c in self.calls if c.tx_id == tx_id]
