"""Traces across real processes: a producer (this process, an in-memory exporter), a coordinator
child with ``--tracing`` configured from the ``OTEL_*`` variables (the SDK's console exporter,
its stdout kept apart), and txbridge's consumers (this process)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from servers.coordinator_process import READY_MARK
from tests.consumers.conftest import FAST_GROUP
from tests.kafka_helpers import eventually, read_topic, wait_for
from tests.tracing_helpers import recording
from txbridge import AsyncTransactionProducer, Message, TransactionProducer, TxState
from txbridge.consumer import (
    ConcurrentConsumer,
    ConsumeConcurrentlyStatus,
    ConsumedMessage,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
)
from txbridge.wire import H_TX, Topics

pytestmark = pytest.mark.integration

SECRET = "traces-test-secret"  # noqa: S105 - a test-only HMAC secret
PARTITIONS = 2


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    with recording() as memory:
        yield memory


@dataclass
class TracedCoordinator:
    """A ``python -m coordinator --tracing`` child; its spans are the JSON objects on its stdout."""

    bootstrap: str
    namespace: str
    proc: subprocess.Popen[bytes]
    spans_path: Path
    log_path: Path

    def spans(self) -> list[dict[str, Any]]:
        text = self.spans_path.read_text()
        decoder, found, at = json.JSONDecoder(), [], 0
        while (at := text.find("{", at)) >= 0:
            span, at = decoder.raw_decode(text, at)
            found.append(span)
        return found

    def stop(self) -> None:
        """SIGTERM: the coordinator shuts its provider down, which exports what is batched."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


@pytest.fixture
def namespace(namespace_factory: Callable[..., str]) -> str:
    return namespace_factory(PARTITIONS, prefix="txbtrace_")


@pytest.fixture
def coordinator(kafka_bootstrap: str, namespace: str, tmp_path: Path) -> Iterator[TracedCoordinator]:
    spans_path, log_path = tmp_path / "spans.json", tmp_path / "coordinator.log"
    env = {
        **os.environ,
        "TXBRIDGE_DEFAULT_SECRET": SECRET,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "traces-test-coordinator",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    cmd = [sys.executable, "-m", "coordinator", "--bootstrap", kafka_bootstrap, "--namespace", namespace]
    cmd += ["--check-delay", "0.5", "--check-backoff", "0.3", "--tracing", "--commit-interval-ms", "20"]
    with spans_path.open("wb") as out, log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=out, stderr=log, stdin=subprocess.DEVNULL, env=env)
    child = TracedCoordinator(kafka_bootstrap, namespace, proc, spans_path, log_path)
    try:
        eventually(lambda: READY_MARK in log_path.read_text() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log_path.read_text()
        yield child
    finally:
        child.stop()


@dataclass
class Traced:
    """What a traced test works with: Kafka, a namespace with its traced coordinator, a topic,
    this process's spans."""

    bootstrap: str
    namespace: str
    coordinator: TracedCoordinator
    exporter: InMemorySpanExporter
    topic: str
    group: Callable[[], str]

    def producer(self, **options: Any) -> TransactionProducer:
        options.setdefault("check", lambda txn: TxState.UNKNOWN)
        return TransactionProducer(
            self.bootstrap,
            self.group(),
            secret=SECRET,
            namespace=self.namespace,
            partitions=PARTITIONS,
            **options,
        )


@pytest.fixture
def traced(
    coordinator: TracedCoordinator,
    exporter: InMemorySpanExporter,
    topic_factory: Callable[..., str],
    group_factory: Callable[[], str],
) -> Traced:
    return Traced(
        coordinator.bootstrap, coordinator.namespace, coordinator, exporter, topic_factory(), group_factory
    )


def _producer(kafka_bootstrap: str, namespace: str, group: str) -> TransactionProducer:
    return TransactionProducer(
        kafka_bootstrap, group, secret=SECRET, namespace=namespace, check=lambda txn: TxState.UNKNOWN
    )


def _hex(number: int, width: int) -> str:
    return f"{number:0{width}x}"


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_a_trace_runs_from_send_in_transaction_through_the_republish_to_both_consumers(
    traced: Traced,
) -> None:
    bootstrap, namespace, topic, exporter = traced.bootstrap, traced.namespace, traced.topic, traced.exporter
    tracer = trace.get_tracer("the-application")

    def execute(txn: Any, arg: Any) -> TxState:
        with tracer.start_as_current_span("insert order"):  # the application's database write
            return TxState.COMMIT

    with traced.producer() as producer:
        result = producer.send_in_transaction(Message(topic, b"order-1", key=b"k1"), execute)
    assert result.state is TxState.COMMIT
    assert result.op_acknowledged

    produced = _one(exporter.get_finished_spans(), "txbridge transaction")
    trace_id, producer_span = produced.context.trace_id, produced.context.span_id
    assert produced.kind is trace.SpanKind.PRODUCER
    assert produced.attributes is not None
    assert produced.attributes["txbridge.tx_id"] == result.tx_id
    assert produced.attributes["txbridge.state"] == "COMMIT"
    local = _one(exporter.get_finished_spans(), "insert order")
    assert local.parent is not None
    assert local.parent.span_id == producer_span
    assert local.context.trace_id == trace_id

    halves = read_topic(bootstrap, Topics(namespace).half, isolation="read_uncommitted")
    assert [h.headers["traceparent"] for h in halves] == [
        f"00-{_hex(trace_id, 32)}-{_hex(producer_span, 16)}-{int(produced.context.trace_flags):02x}".encode()
    ]

    # The coordinator's republish span: a child of the producer's, in the same trace.
    published = wait_for(bootstrap, topic, 1)
    assert [m.value for m in published] == [b"order-1"]
    republish = eventually(
        lambda: [s for s in traced.coordinator.spans() if s["name"] == "txbridge republish"], timeout=30
    )
    assert len(republish) == 1
    assert republish[0]["context"]["trace_id"] == f"0x{_hex(trace_id, 32)}"
    assert republish[0]["parent_id"] == f"0x{_hex(producer_span, 16)}"
    assert republish[0]["attributes"]["txbridge.tx_id"] == result.tx_id
    assert republish[0]["resource"]["attributes"]["service.name"] == "traces-test-coordinator"
    republish_span = republish[0]["context"]["span_id"][2:]
    # ... whose context the republished message carries, in place of the producer's.
    version, carried_trace, carried_span, flags = published[0].headers["traceparent"].decode().split("-")
    assert (version, carried_trace, carried_span) == ("00", _hex(trace_id, 32), republish_span)
    assert int(flags, 16) & 1  # sampled
    assert published[0].headers[H_TX] == result.tx_id.encode()

    # Each consumer's processing span links to the republish span, in the producer's trace.
    seen: list[ConsumedMessage] = []
    orderly = OrderlyConsumer(
        bootstrap,
        traced.group(),
        [topic],
        lambda m, c: seen.append(m) or ConsumeOrderlyStatus.SUCCESS,
        extra_config=FAST_GROUP,
    )
    concurrent = ConcurrentConsumer(
        bootstrap,
        traced.group(),
        [topic],
        lambda m, c: seen.append(m) or ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
        extra_config=FAST_GROUP,
    )
    with orderly, concurrent:
        eventually(lambda: len(seen) >= 2, timeout=60)
    processed = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
    assert len(processed) == 2
    for span in processed:
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.attributes is not None
        assert span.attributes["txbridge.tx_id"] == result.tx_id
        assert [(link.context.trace_id, _hex(link.context.span_id, 16)) for link in span.links] == [
            (trace_id, republish_span)
        ]


def test_a_back_check_span_continues_the_producers_trace(traced: Traced) -> None:
    bootstrap, topic, exporter, coordinator = (
        traced.bootstrap,
        traced.topic,
        traced.exporter,
        traced.coordinator,
    )
    checked: list[str] = []

    def check(txn: Any) -> TxState:
        checked.append(txn.tx_id)
        return TxState.COMMIT

    with traced.producer(check=check) as producer:
        result = producer.send_in_transaction(Message(topic, b"unsure"), lambda txn, arg: TxState.UNKNOWN)
        assert result.state is TxState.UNKNOWN
        assert [m.value for m in wait_for(bootstrap, topic, 1)] == [b"unsure"]
    assert checked == [result.tx_id]

    produced = _one(exporter.get_finished_spans(), "txbridge transaction")
    assert produced.attributes is not None
    assert produced.attributes["txbridge.state"] == "UNKNOWN"
    trace_id = f"0x{_hex(produced.context.trace_id, 32)}"
    parent = f"0x{_hex(produced.context.span_id, 16)}"

    def coordinator_spans() -> dict[str, dict[str, Any]] | None:
        spans = {s["name"]: s for s in coordinator.spans()}
        return spans if {"txbridge back-check", "txbridge republish"} <= spans.keys() else None

    spans = eventually(coordinator_spans, timeout=30)
    for name in ("txbridge back-check", "txbridge republish"):
        assert spans[name]["context"]["trace_id"] == trace_id, name
        assert spans[name]["parent_id"] == parent, name
        assert spans[name]["attributes"]["txbridge.tx_id"] == result.tx_id
    assert spans["txbridge back-check"]["attributes"]["txbridge.state"] == "COMMIT"
    assert spans["txbridge back-check"]["kind"] == "SpanKind.CLIENT"


UNTRACED = textwrap.dedent(
    """
    import json, sys
    from txbridge import AsyncTransactionProducer, Message, TransactionProducer, TxState
    bootstrap, namespace, topic = sys.argv[1:4]
    with TransactionProducer(bootstrap, "untraced", secret="s", namespace=namespace,
                             check=lambda txn: TxState.UNKNOWN) as producer:
        result = producer.send_in_transaction(Message(topic, b"plain"), lambda txn, arg: TxState.ROLLBACK)
    print(json.dumps({"state": result.state.value,
                      "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
    """
)


def test_without_a_tracer_provider_nothing_is_imported_or_carried(
    kafka_bootstrap: str, namespace: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    # A fresh interpreter: opentelemetry is installed (the test extra) but never configured.
    out = subprocess.run(
        [sys.executable, "-c", UNTRACED, kafka_bootstrap, namespace, topic],
        capture_output=True,
        check=True,
        timeout=120,
    )
    report = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert report == {"state": "ROLLBACK", "otel": []}
    halves = read_topic(kafka_bootstrap, Topics(namespace).half, isolation="read_uncommitted")
    assert len(halves) == 1
    assert not {"traceparent", "tracestate"} & halves[0].headers.keys()


def test_with_the_api_imported_but_no_provider_set_halves_carry_no_context(
    kafka_bootstrap: str, namespace: str, topic_factory: Callable[..., str], group_factory: Callable[[], str]
) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    topic = topic_factory()
    with _producer(kafka_bootstrap, namespace, group_factory()) as producer:
        result = producer.send_in_transaction(Message(topic, b"v"), lambda txn, arg: TxState.ROLLBACK)
    assert result.state is TxState.ROLLBACK
    halves = read_topic(kafka_bootstrap, Topics(namespace).half, isolation="read_uncommitted")
    assert len(halves) == 1
    assert "traceparent" not in halves[0].headers


def test_the_context_form_and_the_asyncio_producer_trace_their_transactions_too(
    kafka_bootstrap: str,
    namespace: str,
    exporter: InMemorySpanExporter,
    topic_factory: Callable[..., str],
) -> None:
    topic, tracer = topic_factory(), trace.get_tracer("the-application")

    with _producer(kafka_bootstrap, namespace, "blocking") as producer, producer.transaction() as tx:
        tx.send(Message(topic, b"a"))
        with tracer.start_as_current_span("insert in the block"):
            pass

    async def send_async() -> Any:
        async def execute(txn: Any, arg: Any) -> TxState:
            with tracer.start_as_current_span("insert, async"):
                return TxState.ROLLBACK

        async with AsyncTransactionProducer(
            kafka_bootstrap, "async", secret=SECRET, namespace=namespace, check=lambda txn: TxState.UNKNOWN
        ) as producer:
            return await producer.send_in_transaction(Message(topic, b"b"), execute)

    rolled_back = asyncio.run(send_async())

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert tx.result is not None
    assert tx.result.state is TxState.COMMIT
    assert rolled_back.state is TxState.ROLLBACK
    by_tx = {
        s.attributes["txbridge.tx_id"]: s
        for s in exporter.get_finished_spans()
        if s.name == "txbridge transaction" and s.attributes is not None
    }
    assert by_tx.keys() == {tx.tx_id, rolled_back.tx_id}
    for tx_id, child in ((tx.tx_id, "insert in the block"), (rolled_back.tx_id, "insert, async")):
        parent = spans[child].parent
        assert parent is not None
        assert parent.span_id == by_tx[tx_id].context.span_id
    halves = read_topic(kafka_bootstrap, Topics(namespace).half, isolation="read_uncommitted")
    carried = {h.headers[H_TX].decode(): h.headers["traceparent"].decode().split("-")[2] for h in halves}
    assert carried == {tx_id: _hex(span.context.span_id, 16) for tx_id, span in by_tx.items()}
    assert trace.get_current_span() is trace.INVALID_SPAN  # every context the producers set was left
