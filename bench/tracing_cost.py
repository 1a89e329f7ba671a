"""What traces cost per message, with OpenTelemetry absent, present but unset, and recording.

Each mode runs in a fresh interpreter (a module once imported stays imported), one after the
other, and the table shows them side by side:

- ``absent``: opentelemetry cannot be imported (``pip install txbridge`` without ``[otel]``);
- ``unset``: ``opentelemetry.trace`` imported, no tracer provider set;
- ``recording``: the SDK's provider, every span sampled, exported to nowhere (needs
  opentelemetry-sdk; ``n/a`` without it).

Times are the thread's CPU time (the machine may be shared), each the best of ``--rounds``. Per
mode: ``hooks_ns``, the time of the calls the producer
and the consumers make per message (:func:`txbridge.tracing.begin_transaction`, a ``with`` over
:func:`~txbridge.tracing.current` and over :func:`~txbridge.tracing.processing`, and ending the
span when there is one); ``hooks_peak_bytes`` and ``hooks_kept_bytes``, the most memory those
calls held at once over 10,000 messages, and what they still held after them (tracemalloc: a
per-message allocation that is kept grows the second, one that is not shows in the first only
as one message's worth); ``tx_us``, one single-message transaction through the producer's
in-memory path (ids, encoding, the size rules, the lifecycle; a writer that keeps nothing, no
Kafka).

Run: ``python -m bench.tracing_cost [--transactions N] [--hooks N]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
import tracemalloc
from typing import Any

MODES = ("absent", "unset", "recording")


def _prepare(mode: str) -> bool:
    """Put the interpreter in ``mode``; False when it cannot be (no SDK for ``recording``)."""
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # what an install without it sees
        return True
    from opentelemetry import trace

    if mode == "unset":
        return True
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return False

    class Nowhere(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Nowhere()))
    trace.set_tracer_provider(provider)
    return True


def _hook_loop(count: int) -> None:
    """The calls the producer and the consumers make per message, ``count`` times."""
    from txbridge import tracing
    from txbridge.wire import TxState

    headers = (("txb.tx", b"0190aaaa-0000-7000-8000-000000000000"),)
    for _ in itertools.repeat(None, count):
        trace = tracing.begin_transaction("tx", "group")
        with tracing.current(trace):
            pass
        with tracing.processing("orders", 0, 0, headers, 1):
            pass
        if trace is not None:
            trace.end(TxState.COMMIT, None, messages=1, op_acknowledged=True)


def _hooks(count: int, rounds: int) -> tuple[float, int, int]:
    """ns per message of the hooks (best round), and the bytes they held at most and kept."""
    _hook_loop(100)  # imports and first calls out of the way
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    _hook_loop(min(count, 10_000))
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time_ns()
        _hook_loop(count)
        best = min(best, (time.thread_time_ns() - started) / count)
    return best, peak - base, current - base


def _transactions(count: int, rounds: int) -> float:
    """µs per single-message transaction through the producer's in-memory path (best round)."""
    from txbridge import Message
    from txbridge.producer.catalog import TopicCatalog
    from txbridge.producer.settings import ProducerSettings
    from txbridge.producer.transaction import ProducerTransaction
    from txbridge.wire import TxState

    catalog = TopicCatalog()
    catalog.update({"orders": 12}, listed_at=0.0)
    settings = ProducerSettings.build("broker:9092", "orders", b"secret", partitions=12)

    def write(*record: Any) -> None:
        return None

    message = [Message("orders", b"x" * 200, key=b"customer-7")]
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time_ns()
        for _ in itertools.repeat(None, count):
            tx = ProducerTransaction(settings, catalog, write)
            tx.enqueue(message)
            tx.take_pending()
            tx.settle(())
            tx.decide(TxState.COMMIT)
            tx.outcome(TxState.COMMIT, None, ())
        best = min(best, (time.thread_time_ns() - started) / count / 1000)
    return best


def _one_mode(mode: str, transactions: int, hooks: int, rounds: int) -> dict[str, Any]:
    if not _prepare(mode):
        return {"mode": mode}
    hooks_ns, peak, kept = _hooks(hooks, rounds)
    tx_us = _transactions(transactions, rounds)
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None)
    return {
        "mode": mode,
        "hooks_ns": round(hooks_ns),
        "hooks_peak_bytes": peak,
        "hooks_kept_bytes": kept,
        "tx_us": round(tx_us, 2),
        "otel_modules": len(loaded),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=10_000)
    parser.add_argument("--hooks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="each figure is the best of this many")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in a child
    args = parser.parse_args(argv)
    if args.mode:
        print(json.dumps(_one_mode(args.mode, args.transactions, args.hooks, args.rounds)))
        return
    rows = []
    for mode in MODES:
        cmd = [sys.executable, "-m", __spec__.name, "--mode", mode]
        cmd += [
            "--transactions",
            str(args.transactions),
            "--hooks",
            str(args.hooks),
            "--rounds",
            str(args.rounds),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    columns = ("mode", "hooks_ns", "hooks_peak_bytes", "hooks_kept_bytes", "tx_us", "otel_modules")
    print(" | ".join(columns))
    print(" | ".join("---" for _ in columns))
    for row in rows:
        print(" | ".join(str(row.get(c, "n/a")) for c in columns))


if __name__ == "__main__":
    main()
