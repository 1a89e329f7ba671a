"""This process's tracer provider for a test: spans recorded in memory, the global unset afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Set a tracer provider that records to memory; unset it on leaving.

    OpenTelemetry sets the global provider once per process; unsetting it the way its own test
    utilities do keeps the other tests of this process untraced."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER = None
        trace._TRACER_PROVIDER_SET_ONCE._done = False
