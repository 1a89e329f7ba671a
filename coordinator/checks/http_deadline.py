"""An httpx transport whose every request ends within one deadline, whatever the server does.

httpx's timeouts are per phase and per read: a server that sends a byte every second, in its
headers or its body, never trips a read timeout, and a back-check to it would hold a check
slot (and a worker thread) without end. :class:`DeadlineTransport` gives each request one
deadline, ``total_s`` after it starts: every socket operation of the request (connect, TLS
handshake, each write and read) waits at most until then, and one that starts after it fails
at once. The request then ends with an ``httpx`` timeout error of the phase it was in, as a
slow answer always did, and its connection is closed (httpcore drops a connection whose
request failed).

It is httpcore's connection pool with a network backend that applies the deadline: the
deadline of the request running on the current thread (httpcore's sync pool does every
socket operation of a request on the thread that sent it). The body is read inside the
deadline too: back-check answers are small.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import httpcore
import httpx

_deadline = threading.local()  # .at: the monotonic time the current thread's request must end by

#: httpcore's errors and the httpx errors they become, the most specific first.
_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)

SocketOption: TypeAlias = Any  # httpcore's SOCKET_OPTION (a tuple of level, name, value)


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the current request's deadline; ``error`` once it passed."""
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        tls = self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, bounded, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[SocketOption] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@contextmanager
def _httpx_errors() -> Iterator[None]:
    """httpcore's errors as httpx's (the Checker and its callers know only httpx's)."""
    try:
        yield
    except Exception as exc:
        for source, target in _ERRORS:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


class DeadlineTransport(httpx.BaseTransport):
    """HTTP/1.1 over httpcore's pool; each request ends within ``total_s`` (see the module).

    Args:
        total_s: the longest a request may take, from its start to its last byte.
    """

    def __init__(self, total_s: float) -> None:
        limits = httpx.Limits()
        self.total_s = total_s
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        _deadline.at = time.monotonic() + self.total_s
        try:
            with _httpx_errors():
                response = self._pool.handle_request(core_request)
                try:
                    content = b"".join(response.stream)  # type: ignore[arg-type]  # sync: iterable
                finally:
                    response.close()
        finally:
            _deadline.at = None
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            content=content,
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()
