"""OpenTelemetry traces of txbridge transactions, when the application records traces.

The producer opens a span over each transaction (half records, local transaction, op
record) and carries its context in the half records' headers, W3C ``traceparent`` and
``tracestate``; the coordinator's spans continue it, and a consumer's processing span
links to it (docs/tracing.md).

Only ``opentelemetry-api`` is used (the ``[otel]`` extra; the SDK and its exporters are the
application's choice), and only once the application has imported it: a tracer provider
cannot be configured without importing ``opentelemetry.trace``, so until that module is in
``sys.modules`` nothing could be recorded. Until then, and while no tracer provider is set,
every function here returns ``None`` or a shared no-op, allocates nothing per message and
imports nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from txbridge.wire import H_TX, TxState

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_HEADERS",
    "TransactionTrace",
    "begin_transaction",
    "current",
    "processing",
    "remote_context",
]

#: The W3C Trace Context header names: what OpenTelemetry's Kafka instrumentations read too.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE})

#: The instrumentation scope of txbridge's spans.
SCOPE = "txbridge"

_OTEL_TRACE = "opentelemetry.trace"


class _NoTrace:
    """What :func:`current` and :func:`processing` hand out while nothing is recorded: one
    shared object, so a ``with`` over it allocates nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_TRACE = _NoTrace()


class _TracerOfProvider:
    """The txbridge tracer of the tracer provider in use, made once per provider (the SDK makes
    a new tracer at every ``get_tracer``)."""

    __slots__ = ("provider", "tracer")

    def __init__(self) -> None:
        self.provider: object = None
        self.tracer: Tracer | None = None

    def get(self) -> Tracer | None:
        trace = sys.modules.get(_OTEL_TRACE)
        if trace is None:  # never imported: no provider can be set, nothing is recorded
            return None
        provider = trace.get_tracer_provider()
        if provider is not self.provider:
            # A proxy (no provider set yet) or the no-op provider records nothing: no spans at all.
            unset = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
            self.tracer = None if unset else provider.get_tracer(SCOPE)
            self.provider = provider
        return self.tracer


_tracers = _TracerOfProvider()


def tracer() -> Tracer | None:
    """The tracer txbridge records with, or None when the application records no traces."""
    return _tracers.get()


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def headers_of(context: Context) -> list[tuple[str, bytes]]:
    """``traceparent`` (and ``tracestate`` when there is one) of ``context``, as Kafka headers."""
    carrier: dict[str, str] = {}
    _propagator().inject(carrier, context=context)
    return [(name, value.encode()) for name, value in carrier.items() if name in TRACE_HEADERS]


def remote_context(headers: Iterable[tuple[str, bytes | None]]) -> Context | None:
    """The span context carried by ``headers`` (``traceparent``, ``tracestate``), or None when
    they carry none, or a malformed one."""
    carrier = {
        name: raw.decode("ascii", "replace")
        for name, raw in headers
        if name in TRACE_HEADERS and raw is not None
    }
    if TRACEPARENT not in carrier:
        return None
    from opentelemetry import trace

    context = _propagator().extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def has_traceparent(headers: Sequence[tuple[str, bytes]]) -> bool:
    return any(name == TRACEPARENT for name, _ in headers)


class TransactionTrace:
    """The producer's span over one transaction, from its first half record to its op record.

    Its context rides in every half record (:attr:`headers`); while the local transaction
    runs (``with current(trace)``, or the transaction's ``with`` block) it is the current
    span, so the application's own spans (a database call) are its children.

    Attributes:
        headers: the ``traceparent``/``tracestate`` headers each half record carries.
    """

    __slots__ = ("_span", "_tokens", "headers")

    def __init__(self, span: Span, headers: list[tuple[str, bytes]]) -> None:
        self._span = span
        self._tokens: list[Token[Context]] = []
        self.headers = headers

    def __enter__(self) -> None:
        from opentelemetry import context, trace

        self._tokens.append(context.attach(trace.set_span_in_context(self._span)))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from opentelemetry import context

        if exc is not None and self._span.is_recording():
            self._span.record_exception(exc)
        context.detach(self._tokens.pop())

    def halves_acknowledged(self, failures: Sequence[BaseException]) -> None:
        """The half records written so far were acknowledged (or ``failures`` say which were not)."""
        if failures:
            self._span.add_event("txbridge.half_failed", {"exception.message": str(failures[0])})
        else:
            self._span.add_event("txbridge.halves_acknowledged")

    def end(
        self, state: TxState, error: BaseException | None, *, messages: int, op_acknowledged: bool
    ) -> None:
        """End the span with the transaction's outcome (the op record awaited)."""
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute("txbridge.state", state.value)
        span.set_attribute("messaging.batch.message_count", messages)
        span.set_attribute("txbridge.op_acknowledged", op_acknowledged)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()

    def fail(self, error: BaseException) -> None:
        """End the span of a transaction that wrote nothing (its message was refused)."""
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self._span.end()


def begin_transaction(tx_id: str, group: str) -> TransactionTrace | None:
    """Start the span of transaction ``tx_id`` (a child of the current span, if any); None
    when the application records no traces."""
    recorder = _tracers.get()
    if recorder is None:
        return None
    from opentelemetry import trace

    span = recorder.start_span(
        "txbridge transaction",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "txbridge.tx_id": tx_id,
            "txbridge.group": group,
        },
    )
    if not span.get_span_context().is_valid:  # sampled out with no context to carry
        span.end()
        return None
    return TransactionTrace(span, headers_of(trace.set_span_in_context(span)))


def current(trace: TransactionTrace | None) -> TransactionTrace | _NoTrace:
    """``with current(trace):`` makes the transaction's span the current one (nothing when None)."""
    return _NO_TRACE if trace is None else trace


class _Processing:
    """A consumer's span over one listener call, linked to the producer's trace."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> None:
        from opentelemetry import context, trace

        self._token = context.attach(trace.set_span_in_context(self._span))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        if self._token is not None:
            context.detach(self._token)
        self._span.end()


def processing(
    topic: str, partition: int, offset: int, headers: Sequence[tuple[str, bytes]], attempt: int
) -> _Processing | _NoTrace:
    """``with processing(...):`` around a listener call on the message at ``topic``/``partition``
    @``offset``: a CONSUMER span linked to the context its ``headers`` carry (the coordinator's
    republish span, or the producer's)."""
    recorder = _tracers.get()
    if recorder is None:
        return _NO_TRACE
    from opentelemetry import trace

    carried = remote_context(headers)
    links = [] if carried is None else [trace.Link(trace.get_current_span(carried).get_span_context())]
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
        "txbridge.attempt": attempt,
    }
    for name, raw in headers:
        if name == H_TX:
            attributes["txbridge.tx_id"] = raw.decode("utf-8", "replace")
    span = recorder.start_span(
        f"process {topic}", kind=trace.SpanKind.CONSUMER, attributes=attributes, links=links
    )
    return _Processing(span)
