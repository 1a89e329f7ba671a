"""Traces without a broker: what the producer's records carry, the coordinator's spans on a fake
writer and checker, the consumer's span, and an install without OpenTelemetry (real Kafka:
tests/integration/test_traces.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from coordinator.checks.checker import CheckJob, CheckResult
from coordinator.commit import tracing as coordinator_tracing
from coordinator.state.republisher import OutRecord, plan_republish
from tests.tracing_helpers import recording
from tests.unit.installs import absent_modules, run_without
from txbridge import Message, tracing
from txbridge.errors import ConfigurationError, MessageTooLargeError
from txbridge.producer.catalog import TopicCatalog
from txbridge.producer.settings import ProducerSettings
from txbridge.producer.transaction import ProducerTransaction
from txbridge.wire import CheckMessage, CheckRequest, TxState, decode_half


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    with recording() as memory:
        yield memory


def _factory(written: list[Any], **options: Any) -> Callable[[], ProducerTransaction[None]]:
    catalog = TopicCatalog()
    catalog.update({"orders": 2}, listed_at=0.0)
    settings = ProducerSettings.build("broker:9092", "g", b"secret", partitions=4, **options)
    return partial(ProducerTransaction, settings, catalog, lambda *record: written.append(record))


def _headers(record: tuple[Any, ...]) -> dict[str, bytes]:
    return dict(record[4])


def test_each_half_record_carries_the_transactions_span_and_a_message_keeps_its_own(
    exporter: InMemorySpanExporter,
) -> None:
    written: list[Any] = []
    tx = _factory(written)()
    own = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    tx.enqueue([Message("orders", b"a"), Message("orders", b"b", headers={"traceparent": own})])
    tx.take_pending()
    tx.settle([])
    tx.outcome(TxState.COMMIT, None, [])

    [span] = exporter.get_finished_spans()
    context = span.context
    assert span.name == "txbridge transaction"
    assert span.attributes is not None
    assert span.attributes["txbridge.state"] == "COMMIT"
    assert [e.name for e in span.events] == ["txbridge.halves_acknowledged"]
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}".encode()
    first, second = (_headers(r) for r in written)
    assert first["traceparent"] == expected
    assert [n for n, _ in written[1][4]].count("traceparent") == 1
    assert second["traceparent"] == own
    # The coordinator reads the trace headers as user headers: republished unchanged without tracing.
    half = decode_half(b"a", written[0][4])
    assert ("traceparent", expected) in half.republish_headers()


def test_the_trace_headers_count_toward_max_message_bytes() -> None:
    message = Message("orders", b"v" * 100)
    limit = 64 + 100 + len("txb.tx") + 36  # what the coordinator counts without trace headers
    _factory([], max_message_bytes=limit)().enqueue([message])  # fits exactly, untraced

    with recording() as exporter:
        traced = _factory([], max_message_bytes=limit)()
        with pytest.raises(MessageTooLargeError, match="is 272 bytes"):  # + traceparent, 11 + 55
            traced.enqueue([message])

    [span] = exporter.get_finished_spans()  # nothing written: the refusal ended the span
    assert span.status.status_code is StatusCode.ERROR
    assert traced.trace is None


def test_without_a_provider_nothing_is_recorded_or_carried() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    written: list[Any] = []
    tx = _factory(written)()
    tx.enqueue([Message("orders", b"a")])

    assert tx.trace is None
    assert "traceparent" not in _headers(written[0])
    assert tracing.current(None) is tracing.current(None)  # one shared no-op: nothing allocated
    assert tracing.processing("t", 0, 0, (), 1) is tracing.current(None)


def _record(topic: str, headers: list[tuple[str, bytes]]) -> OutRecord:
    return OutRecord(topic, b"k", b"v", [*headers, ("txb.tx", b"tx-1")])


class _Writer:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    def republish(self, tx_id: str, records: list[OutRecord]) -> str | None:
        self.records = records
        return None


def test_the_republish_span_is_the_producers_child_and_its_messages_carry_it(
    exporter: InMemorySpanExporter,
) -> None:
    written: list[Any] = []
    tx = _factory(written)()
    tx.enqueue([Message("orders", b"a", headers={"user": b"1"})])
    half = decode_half(b"a", written[0][4])
    plan = plan_republish([half], 10_000, lambda topic: 2)
    assert not isinstance(plan, str)
    writer = _Writer()
    spans = coordinator_tracing.spans_for(True)

    assert spans.republish(writer, "tx-1", [half], plan) is None

    [republish] = exporter.get_finished_spans()
    assert republish.parent is not None
    assert republish.parent.span_id == tx.trace._span.get_span_context().span_id  # type: ignore[union-attr]
    assert republish.context.trace_id == tx.trace._span.get_span_context().trace_id  # type: ignore[union-attr]
    [out] = writer.records
    carried = dict(out.headers)["traceparent"].decode().split("-")
    assert carried[1:3] == [f"{republish.context.trace_id:032x}", f"{republish.context.span_id:016x}"]
    assert [n for n, _ in out.headers] == ["traceparent", "user", "txb.tx"]
    # A message without a producer context is republished as it came (its size as checked).
    untraced = _record("orders", [("user", b"1")])
    spans.republish(writer, "tx-2", [], [untraced])
    assert writer.records == [untraced]


def test_each_checked_transaction_gets_a_span_in_its_producers_trace(
    exporter: InMemorySpanExporter,
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    jobs = [
        CheckJob(0, CheckRequest(tx, "g", "i", 1, (CheckMessage("orders", None, headers),)), ("u",))
        for tx, headers in (("t1", (("traceparent", parent.encode()),)), ("t2", ()))
    ]

    def check(batch: list[CheckJob]) -> list[CheckResult]:
        return [CheckResult(batch[0], TxState.COMMIT, "u"), CheckResult(batch[1], TxState.UNKNOWN, "u")]

    results = coordinator_tracing.spans_for(True).checked(jobs, check)

    assert [r.state for r in results] == [TxState.COMMIT, TxState.UNKNOWN]
    first, second = exporter.get_finished_spans()
    assert first.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert first.parent is not None
    assert first.parent.span_id == 0xB7AD6B7169203331
    assert first.attributes is not None
    assert first.attributes["txbridge.state"] == "COMMIT"
    assert second.parent is None  # no producer context: a trace of its own
    assert second.attributes is not None
    assert second.attributes["txbridge.state"] == "UNKNOWN"


def test_a_consumers_span_links_to_the_carried_context_and_shows_a_listener_error(
    exporter: InMemorySpanExporter,
) -> None:
    carried = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = (("traceparent", carried.encode()), ("txb.tx", b"tx-9"))

    with pytest.raises(ValueError, match="boom"), tracing.processing("orders", 1, 42, headers, 2):
        raise ValueError("boom")

    [span] = exporter.get_finished_spans()
    assert span.name == "process orders"
    assert span.kind is trace.SpanKind.CONSUMER
    assert span.status.status_code is StatusCode.ERROR
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    ]
    assert span.attributes is not None
    assert span.attributes["txbridge.tx_id"] == "tx-9"
    assert span.attributes["messaging.kafka.offset"] == 42
    # A malformed traceparent is no context: no link, nothing raised.
    with tracing.processing("orders", 1, 43, (("traceparent", b"garbage"),), 1):
        pass
    assert exporter.get_finished_spans()[-1].links == ()


def test_the_coordinators_exporter_comes_from_the_otel_environment() -> None:
    with pytest.raises(
        ConfigurationError, match=r"OTEL_TRACES_EXPORTER names 'nowhere'.*installed: .*console"
    ):
        coordinator_tracing.install_provider({"OTEL_TRACES_EXPORTER": "nowhere"})
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # nothing was set
    assert coordinator_tracing.spans_for(False) is coordinator_tracing.NO_SPANS


def test_the_coordinator_uses_a_provider_the_application_set(exporter: InMemorySpanExporter) -> None:
    provider = trace.get_tracer_provider()

    assert coordinator_tracing.install_provider({"OTEL_TRACES_EXPORTER": "console"}) is None
    assert trace.get_tracer_provider() is provider


INSTALL_WITHOUT_OTEL = """
from coordinator.commit.tracing import spans_for
from txbridge import Message, tracing
from txbridge.producer.catalog import TopicCatalog
from txbridge.producer.settings import ProducerSettings
from txbridge.producer.transaction import ProducerTransaction
from txbridge.errors import ConfigurationError

catalog = TopicCatalog()
catalog.update({"orders": 1}, listed_at=0.0)
written = []
settings = ProducerSettings.build("broker:9092", "g", b"secret", partitions=1)
tx = ProducerTransaction(settings, catalog, lambda *record: written.append(record))
tx.enqueue([Message("orders", b"v")])
assert tx.trace is None and tracing.tracer() is None
assert [name for name, _ in written[0][4] if name in tracing.TRACE_HEADERS] == []
try:
    spans_for(True)
except ConfigurationError as exc:
    print(exc)
"""


def test_an_install_without_opentelemetry_traces_nothing_and_the_coordinator_says_what_to_install() -> None:
    assert "opentelemetry" in absent_modules(["coordinator"])

    result = run_without(INSTALL_WITHOUT_OTEL, ["coordinator"])

    assert result.returncode == 0, result.stderr[-3000:]
    assert "OpenTelemetry is not installed: pip install 'txbridge[coordinator,otel]'" in result.stdout


def test_the_cost_benchmark_runs_each_mode_and_the_untraced_ones_keep_nothing() -> None:
    small = ["--transactions", "20", "--hooks", "200", "--rounds", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "bench.tracing_cost", *small],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    header, _rule, *rows = result.stdout.strip().splitlines()
    table = [dict(zip(header.split(" | "), row.split(" | "), strict=True)) for row in rows]
    assert [row["mode"] for row in table] == ["absent", "unset", "recording"]
    absent, unset, recording = table
    assert absent["otel_modules"] == "0"
    assert absent["hooks_kept_bytes"] == unset["hooks_kept_bytes"] == "0"
    assert int(recording["otel_modules"]) > int(unset["otel_modules"]) > 0
    assert all(float(row["tx_us"]) > 0 for row in table)
