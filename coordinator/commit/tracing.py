"""The coordinator's spans, with the ``tracing`` setting: each transaction's back-checks and its
republish continue the trace its producer started (docs/tracing.md).

The producer's context is read from the ``traceparent``/``tracestate`` its half records carry
(:mod:`txbridge.tracing`). A back-check span is a child of the producer's transaction span; so
is the republish span, and the republished messages carry the republish span's context in place
of the producer's, so a consumer's span links to the whole chain.

Without the setting the parts get :data:`NO_SPANS`, which only calls through: nothing of
OpenTelemetry is imported. With it, spans go to the process's tracer provider: the one the
application set, or, under ``python -m coordinator`` / ``txbridge coordinator``, one built by
:func:`install_provider` from the standard ``OTEL_*`` environment variables (the SDK is needed).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from coordinator.state.republisher import OutRecord
from txbridge.errors import ConfigurationError
from txbridge.tracing import TRACE_HEADERS, headers_of, remote_context
from txbridge.wire import HalfMessage

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger(__name__)

#: The instrumentation scope of the coordinator's spans.
SCOPE = "txbridge.coordinator"
#: ``service.name`` of a provider built from the environment that names none.
SERVICE_NAME = "txbridge-coordinator"

_INSTALL_SDK = (
    "pip install 'txbridge[coordinator,otel]' opentelemetry-sdk, and an exporter "
    "(e.g. opentelemetry-exporter-otlp), or turn tracing off"
)


class Republisher(Protocol):
    def republish(self, tx_id: str, records: list[OutRecord]) -> str | None: ...


class NoSpans:
    """No tracing: every call goes straight through."""

    def checked(self, jobs: Sequence[Any], check: Callable[[Any], list[Any]]) -> list[Any]:
        """``check(jobs)``: the back-check results of ``jobs``."""
        return check(jobs)

    def republish(
        self, writer: Republisher, tx_id: str, messages: Sequence[HalfMessage], records: list[OutRecord]
    ) -> str | None:
        """``writer.republish(tx_id, records)``."""
        return writer.republish(tx_id, records)


NO_SPANS = NoSpans()


class Spans(NoSpans):
    """Back-check and republish spans, children of each transaction's producer span.

    Args:
        tracer: where the spans go.
    """

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def checked(self, jobs: Sequence[Any], check: Callable[[Any], list[Any]]) -> list[Any]:
        """One ``txbridge back-check`` span per transaction of the request(s) ``check`` makes,
        each ended with the answer (``txbridge.state``) and who gave it."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        spans = []
        for job in jobs:
            request = job.request
            parent = remote_context(header for m in request.messages for header in m.headers)
            spans.append(
                self._tracer.start_span(
                    "txbridge back-check",
                    context=parent,
                    kind=SpanKind.CLIENT,
                    attributes={
                        "txbridge.tx_id": request.tx_id,
                        "txbridge.group": request.group,
                        "txbridge.instance": request.instance,
                        "txbridge.attempt": request.attempt,
                    },
                )
            )
        try:
            results = check(jobs)
        except BaseException as exc:
            for span in spans:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                span.end()
            raise
        by_tx = {result.job.request.tx_id: result for result in results}
        for job, span in zip(jobs, spans, strict=True):
            result = by_tx.get(job.request.tx_id)
            if result is not None:
                span.set_attribute("txbridge.state", result.state.value)
                span.set_attribute("txbridge.asked", result.asked)
                span.set_attribute("txbridge.detail", result.detail)
            span.end()
        return results

    def republish(
        self, writer: Republisher, tx_id: str, messages: Sequence[HalfMessage], records: list[OutRecord]
    ) -> str | None:
        """Produce ``records`` under a ``txbridge republish`` span; they carry its context in place of
        the producer's (a message without one is republished unchanged, so its size is as checked).

        The span ends once the records are in the partition's Kafka transaction; a
        transaction that is aborted and sent again has a second span.
        """
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        parent = remote_context(header for m in messages[:1] for header in m.user_headers)
        span = self._tracer.start_span(
            "txbridge republish",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.batch.message_count": len(records),
                "messaging.destination.name": sorted({r.topic for r in records}),
                "txbridge.tx_id": tx_id,
            },
        )
        carried = headers_of(trace.set_span_in_context(span))
        records = [_carrying(record, carried) for record in records]
        try:
            refused = writer.republish(tx_id, records)
        except BaseException as exc:
            _end_failed(span, exc)
            raise
        if refused is not None:
            span.set_status(Status(StatusCode.ERROR, refused))
        span.end()
        return refused


def _end_failed(span: Span, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.end()


def _carrying(record: OutRecord, carried: list[tuple[str, bytes]]) -> OutRecord:
    """``record`` with ``carried`` in place of the trace headers it has (none: unchanged)."""
    if not any(name in TRACE_HEADERS for name, _ in record.headers):
        return record
    kept = [(name, raw) for name, raw in record.headers if name not in TRACE_HEADERS]
    return dataclasses.replace(record, headers=[*carried, *kept])


def spans_for(enabled: bool) -> NoSpans:
    """The coordinator's spans: :class:`Spans` when ``enabled`` (the ``tracing`` setting), else
    :data:`NO_SPANS`.

    Raises:
        ConfigurationError: tracing is on and opentelemetry-api is not installed.
    """
    if not enabled:
        return NO_SPANS
    try:
        from opentelemetry import trace
    except ImportError:
        raise ConfigurationError(f"tracing is on; OpenTelemetry is not installed: {_INSTALL_SDK}") from None
    return Spans(trace.get_tracer(SCOPE))


def install_provider(env: Mapping[str, str]) -> Any:
    """Set the process's tracer provider from the ``OTEL_*`` environment variables, unless the
    application set one already; returns the provider built (to shut down at exit), or None.

    ``OTEL_TRACES_EXPORTER`` (comma-separated, default ``otlp``; ``none``: no export) names the
    exporters by their entry points (``console`` comes with the SDK, ``otlp`` with
    opentelemetry-exporter-otlp); the SDK reads the rest itself (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_*``).

    Raises:
        ConfigurationError: the SDK, or a named exporter, is not installed.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigurationError(f"tracing needs the OpenTelemetry SDK: {_INSTALL_SDK}") from None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # the application's own (opentelemetry-instrument, or set in code)
    exporters = [_exporter(name.strip()) for name in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    logger.info(
        "tracing: spans of %s exported to %s",
        resource.attributes.get("service.name"),
        env.get("OTEL_TRACES_EXPORTER", "otlp"),
    )
    return provider


def _exporter(name: str) -> Any:
    """The span exporter registered as ``name`` (``none``: None)."""
    from importlib.metadata import entry_points

    if name in ("none", ""):
        return None
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        known = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {name!r}, an exporter that is not installed (installed: "
            f"{', '.join(known) or 'none'}); for otlp: pip install opentelemetry-exporter-otlp"
        )
    return next(iter(found)).load()()
