"""``txbridge bench``: txbridge against raw Kafka and native Kafka transactions, in one run."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import click

from txbridge.bench.kafka_native import Figure, native_transactions, raw_produce
from txbridge.cli import _one_line_errors, bootstrap_option, resolve_bootstrap

__all__ = ["Figure", "bench"]

_MODES = {
    # mode: (raw count, native duration s)
    "quick": (50_000, 5.0),
    "full": (500_000, 20.0),
}


@click.command()
@bootstrap_option
@click.option("--quick", is_flag=True, help="About a minute: smaller counts, shorter runs.")
@click.option("--size", default=512, show_default=True, help="Message size in bytes.")
@click.option("--concurrency", default=8, show_default=True, help="Producers/transactions in flight.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@_one_line_errors
def bench(bootstrap: str | None, quick: bool, size: int, concurrency: int, out: Path) -> None:
    """Measure raw produce, native Kafka transactions and txbridge side by side."""
    from rich.console import Console

    from txbridge import _kafka
    from txbridge.bench import results

    console = Console()
    mode = "quick" if quick else "full"
    raw_count, native_s = _MODES[mode]
    bootstrap = resolve_bootstrap(bootstrap, start_local=True)
    run = uuid.uuid4().hex[:8]
    topics = {name: f"bench-{run}-{name}" for name in ("raw", "native1", "native100")}
    _kafka.ensure_topics(bootstrap, [_kafka.TopicSpec(t, 6) for t in topics.values()])

    figures: list[Figure] = []
    steps = [
        ("raw produce", lambda: raw_produce(bootstrap, topics["raw"], size=size, count=raw_count)),
        (
            "native txn per message",
            lambda: native_transactions(
                bootstrap,
                topics["native1"],
                size=size,
                per_txn=1,
                duration_s=native_s,
                concurrency=concurrency,
            ),
        ),
        (
            "native txn batched",
            lambda: native_transactions(
                bootstrap, topics["native100"], size=size, per_txn=100, duration_s=native_s, concurrency=2
            ),
        ),
    ]
    started = time.monotonic()
    for label, step in steps:
        with console.status(f"[bold]{label}[/] ..."):
            figure = step()
        figures.append(figure)
        console.print(f"  {label}: {figure.msgs_per_s:,.0f} msgs/s")
    console.print(results.render(figures))
    path = results.write_json(figures, out, mode=mode, bootstrap=bootstrap)
    (out / f"latest-{mode}.md").write_text(results.markdown(figures, results.machine()))
    console.print(f"results: {path} ({time.monotonic() - started:.0f}s)")
