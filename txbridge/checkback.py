"""The back-check endpoint: an ASGI app (mountable anywhere) and a built-in uvicorn server.

``POST /txbridge/check`` with a :class:`~txbridge.wire.CheckRequest` body (one
transaction) or a :class:`~txbridge.wire.CheckBatch` body (several), and a
``Txbridge-Signature`` header. The signature is verified before the body is
parsed or any user code runs:

- unsigned, malformed, wrong or stale signature: **401** ``{"error": ...}``;
- signed but not a check request: **400**; a check for another group: **404**;
- a replay of a request already answered (see :class:`ReplayMemory`): **409**;
- otherwise **200** with ``{"state": "COMMIT" | "ROLLBACK" | "UNKNOWN" | "RUNNING"}``, or
  for a batch ``{"states": {"<tx id>": ..., ...}}``; a check function that raises (or
  answers something else) yields UNKNOWN for its transaction only.

RUNNING says "this instance is alive and the transaction's local work is still in
progress": the coordinator asks again later without using up ``max_checks``, where an
UNKNOWN ("I do not know") uses it up. Answer it only while the work really goes on here:
a transaction answered RUNNING never expires while this instance answers.

A batch costs one request, one signature check and one worker-thread hop: the check
function runs for each transaction in turn (an ``async`` one concurrently).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import inspect
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from txbridge import wire
from txbridge.errors import CheckBackError, ConfigurationError, SignatureError, WireFormatError
from txbridge.transaction import LocalTransaction, coerce_state, local_transaction_from_check
from txbridge.wire import TxState

logger = logging.getLogger(__name__)

CHECK_PATH = "/txbridge/check"
CheckFunction = Callable[[LocalTransaction], Any]
#: How many answered back-check requests a check app remembers, to refuse their replays.
DEFAULT_REPLAY_MEMORY = 100_000
#: The answer to a replayed request: the coordinator reads anything but a 200 as UNKNOWN.
REPLAY_STATUS = 409


def build_check_app(
    group: str,
    secret: bytes,
    check: CheckFunction,
    *,
    tolerance_s: float = wire.DEFAULT_SIGNATURE_TOLERANCE_S,
    replay_memory: int = DEFAULT_REPLAY_MEMORY,
) -> Starlette:
    """The ASGI app answering back-checks of ``group`` with ``check``.

    Args:
        group: the producer group this app answers for.
        secret: the group's HMAC secret (kept in memory only, never logged).
        check: ``check(txn) -> TxState``; may be a plain or an ``async`` function.
            Plain functions run in a worker thread (they usually query a database).
            ``TxState.RUNNING`` is an answer too (see the module docstring).
        tolerance_s: how far a signature's timestamp may be from this clock.
        replay_memory: how many requests signed within ``tolerance_s`` the app remembers
            to refuse their replays (see :class:`ReplayMemory`).

    Raises:
        ConfigurationError: ``tolerance_s`` or ``replay_memory`` is not positive.
    """
    replays = ReplayMemory(tolerance_s, replay_memory)

    async def handle(request: Request) -> Response:
        body = await request.body()
        # One clock reading for the signature and the replay memory: what one calls fresh
        # the other has not forgotten.
        now = time.time()
        try:
            signed_at = wire.verify(
                secret, request.headers.get(wire.SIGNATURE_HEADER), body, now=now, tolerance_s=tolerance_s
            )
        except SignatureError as exc:
            logger.warning("rejected a back-check from %s: %s", _peer(request), exc)
            return JSONResponse({"error": str(exc)}, status_code=401)
        try:
            request_id, parsed = wire.decode_check_post(body)
        except WireFormatError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if parsed.group != group:
            return JSONResponse(
                {"error": f"this producer answers back-checks of group {group!r} only"}, status_code=404
            )
        # Remembered before the check runs (no await in between), so two copies racing in
        # are answered once, and a check that raises still counts as answered.
        refusal = replays.admit(_replay_key(request_id, signed_at, body), signed_at, now)
        if refusal is not None:
            logger.warning(
                "refused a back-check from %s (request %s): %s",
                _peer(request),
                request_id or "without id",
                refusal,
            )
            return JSONResponse({"error": refusal}, status_code=REPLAY_STATUS)
        requests = parsed.checks if isinstance(parsed, wire.CheckBatch) else (parsed,)
        txns = [local_transaction_from_check(r) for r in requests]
        if inspect.iscoroutinefunction(check):
            states = list(await asyncio.gather(*(_run_async_check(check, t) for t in txns)))
        else:
            states = await run_in_threadpool(_run_sync_checks, check, txns)
            for i, state in enumerate(states):
                if inspect.isawaitable(state):  # a plain function that returned an awaitable
                    states[i] = _verdict(txns[i], await _guarded(state, txns[i]))
        if isinstance(parsed, wire.CheckBatch):
            answer = wire.encode_check_batch_answer({t.tx_id: s for t, s in zip(txns, states, strict=True)})
        else:
            answer = wire.encode_check_answer(states[0])
        return Response(answer, media_type="application/json")

    return Starlette(routes=[Route(CHECK_PATH, handle, methods=["POST"])])


def _replay_key(request_id: str | None, signed_at: int, body: bytes) -> str:
    """What a request is remembered by: its id, or without one the digest of what was signed.

    A replay repeats the signed ``<t>.<body>`` exactly, so a body without an id (from a
    coordinator that predates ids) is protected too; the prefixes keep the two apart.
    """
    if request_id is not None:
        return "id:" + request_id
    return "sig:" + hashlib.sha256(f"{signed_at}.".encode() + body).hexdigest()


class ReplayMemory:
    """The requests answered within the signature tolerance, so that a replay is refused.

    A replayed request carries a valid signature until it is older than ``tolerance_s``,
    so a request is remembered, with the time it was signed, until then. Memory is
    bounded by ``capacity``. When it is full, the requests of the oldest remembered second
    are forgotten, and from then on every request signed at or before that second is
    refused too: forgetting a request that is still inside the window would let its
    replay through, while refusing a genuine one is harmless (the coordinator reads the
    refusal as UNKNOWN and asks again later, with a fresh signature). So under a flood the
    window shrinks; it never reopens.

    All refusals go through one monotone *floor*: requests signed before it are refused
    and none signed at or after it is forgotten. Expiry raises it to ``now - tolerance_s``
    (requests that old fail the signature check anyway) and keeps it there if the clock
    steps back; a full memory raises it past the oldest second.

    Args:
        tolerance_s: the signature tolerance (seconds) of the app using it.
        capacity: most requests remembered at once.

    Raises:
        ConfigurationError: ``tolerance_s`` or ``capacity`` is not positive.
    """

    def __init__(self, tolerance_s: float, capacity: int = DEFAULT_REPLAY_MEMORY) -> None:
        if not tolerance_s > 0:
            raise ConfigurationError(f"tolerance_s must be positive, got {tolerance_s!r}")
        if capacity < 1:
            raise ConfigurationError(f"replay_memory must be at least 1 request, got {capacity!r}")
        self.tolerance_s = tolerance_s
        self.capacity = capacity
        self._signed_at: dict[str, int] = {}
        self._by_age: list[tuple[int, str]] = []  # a heap: the oldest-signed request first
        self._floor = float("-inf")
        self._lock = threading.Lock()  # the app runs on one event loop, but an app may be shared

    def __len__(self) -> int:
        return len(self._signed_at)

    @property
    def floor(self) -> float:
        """Requests signed (unix seconds) before this are refused."""
        return self._floor

    def admit(self, key: str, signed_at: int, now: float) -> str | None:
        """Remember the request ``key`` signed at ``signed_at``, or say why it is refused.

        Args:
            key: what identifies the request (its id).
            signed_at: its signature's timestamp, unix seconds.
            now: this clock, as used to verify the signature.

        Returns:
            ``None`` when the request is new (it is now remembered), or the reason it is refused.
        """
        with self._lock:
            self._raise_floor(now - self.tolerance_s)
            if key in self._signed_at:
                return "this request was already answered: a replay is refused (send a new request)"
            if signed_at >= self._floor and len(self._signed_at) >= self.capacity:
                oldest = self._by_age[0][0]
                self._raise_floor(oldest + 1)
                logger.warning(
                    "back-check replay memory is full (%d requests): forgot those signed at t=%d, "
                    "refusing requests signed before t=%d",
                    self.capacity,
                    oldest,
                    oldest + 1,
                )
            if signed_at < self._floor:
                return (
                    f"request signed at t={signed_at} is older than this producer remembers "
                    f"(t>={math.ceil(self._floor)}): send a new request"
                )
            self._signed_at[key] = signed_at
            heapq.heappush(self._by_age, (signed_at, key))
            return None

    def _raise_floor(self, floor: float) -> None:
        self._floor = max(self._floor, floor)
        while self._by_age and self._by_age[0][0] < self._floor:
            _, key = heapq.heappop(self._by_age)
            del self._signed_at[key]


def _run_sync_checks(check: CheckFunction, txns: list[LocalTransaction]) -> list[Any]:
    """In one worker thread: each transaction's verdict (or an awaitable the loop resolves)."""
    out: list[Any] = []
    for txn in txns:
        try:
            answer = check(txn)
        except Exception as exc:  # the user's code: any failure is UNKNOWN, asked again later
            _log_failure(txn, exc)
            out.append(TxState.UNKNOWN)
            continue
        out.append(answer if inspect.isawaitable(answer) else _verdict(txn, answer))
    return out


async def _run_async_check(check: CheckFunction, txn: LocalTransaction) -> TxState:
    try:
        pending = check(txn)
    except Exception as exc:  # e.g. a TypeError binding the arguments
        _log_failure(txn, exc)
        return TxState.UNKNOWN
    return _verdict(txn, await _guarded(pending, txn))


async def _guarded(awaitable: Any, txn: LocalTransaction) -> Any:
    try:
        return await awaitable
    except Exception as exc:
        _log_failure(txn, exc)
        return TxState.UNKNOWN


def _log_failure(txn: LocalTransaction, exc: Exception) -> None:
    logger.warning(
        "back-check of transaction %s (attempt %d) raised %s: answering UNKNOWN",
        txn.tx_id,
        txn.attempt,
        type(exc).__name__,
        exc_info=logger.isEnabledFor(logging.DEBUG),
    )


def _verdict(txn: LocalTransaction, answer: Any) -> TxState:
    state = coerce_state(answer)
    if state is TxState.UNKNOWN and answer is not TxState.UNKNOWN:
        logger.warning("back-check of %s answered %r, not a TxState: answering UNKNOWN", txn.tx_id, answer)
    return state


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"


class CheckServer:
    """The built-in check server: uvicorn on ``host:port`` in a background thread.

    Args:
        app: the ASGI app (from :func:`build_check_app`).
        host: interface to listen on.
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).

    No I/O until :meth:`start`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    def start(self, timeout: float = 10.0) -> int:
        """Bind, serve in the background, and return the port once uvicorn accepts connections.

        Raises:
            ConfigurationError: the address cannot be bound (say which one).
            CheckBackError: the server did not come up within ``timeout``.
        """
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are
        # TCP, and without it every answer waits ~40 ms for a delayed ACK (Nagle).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot listen for back-checks on {self.host}:{self.requested_port} ({exc}): "
                "pass another check_host/check_port (check_port=0 picks a free port)"
            ) from exc
        self.port = sock.getsockname()[1]
        self._socket = sock
        # log_config=None: a library leaves logging configuration to the application.
        config = uvicorn.Config(
            self.app, log_config=None, lifespan="off", access_log=False, timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="txbridge-check-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise CheckBackError(f"the check server on {self.host}:{self.port} did not start")
            time.sleep(0.02)
        logger.info("serving back-checks on %s:%d%s", self.host, self.port, CHECK_PATH)
        return self.port

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is None:
            return
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._socket is not None:
            self._socket.close()
        self._server = None
        self._thread = None
        self._socket = None
