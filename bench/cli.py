"""``txbridge bench``: txbridge against raw Kafka and native Kafka transactions, in one run.

The benchmark itself is :mod:`bench`, imported when the command runs (it needs the
``bench`` extra: psutil, rich, the coordinator's packages).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import click

from bench.steps import STEPS
from txbridge.client_config import ClientConfig
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap

__all__ = ["bench"]


@click.command()
@bootstrap_option
@client_options
@click.option("--quick", is_flag=True, help="About a minute: smaller counts, shorter runs.")
@click.option("--size", default=512, show_default=True, help="Message size in bytes.")
@click.option("--concurrency", default=8, show_default=True, help="Native transactional producers.")
@click.option("--in-flight", default=256, show_default=True, help="txbridge transactions in flight.")
@click.option(
    "--producers",
    type=click.IntRange(min=1),
    default=None,
    help="Producer processes of the e2e run, sharing --in-flight (default: one per four cores).",
)
@click.option("--only", multiple=True, type=click.Choice(STEPS), help="Run only these steps (repeatable).")
@click.option("--skip", multiple=True, type=click.Choice(STEPS), help="Leave these steps out (repeatable).")
@click.option(
    "--rocketmq-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="The gRPC proxy of an existing RocketMQ 5 for the rocketmq step (default: start a local one).",
)
@click.option(
    "--rocketmq-namesrv", default=None, metavar="HOST:PORT", help="Its name server (to create topics)."
)
@click.option("--rocketmq-cluster", default="DefaultCluster", show_default=True, help="Its cluster name.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--keep-broker", is_flag=True, help="Leave a local broker this run started running.")
@click.option("--keep-topics", is_flag=True, help="Keep this run's topics (deleted at the end by default).")
@one_line_errors
def bench(**options: object) -> None:
    """Measure raw produce, native Kafka transactions and txbridge side by side."""
    from servers.broker import LocalKafka

    local = LocalKafka.from_home()
    client: ClientConfig = options["client"]  # type: ignore[assignment]
    started_broker = not (options["bootstrap"] or client.bootstrap) and not local.status().running
    try:
        _run(options)
    finally:
        if started_broker and not options["keep_broker"]:
            LocalKafka.from_home().stop()


def _run(options: dict[str, object]) -> None:
    from rich.console import Console

    from bench import results
    from bench.rocketmq import RocketMQOptions, StepSkipped
    from bench.runner import MODES, BenchRun

    console = Console()
    mode = "quick" if options["quick"] else "full"
    client: ClientConfig = options["client"]  # type: ignore[assignment]
    bootstrap = resolve_bootstrap(options["bootstrap"], start_local=True, client=client)  # type: ignore[arg-type]
    run = BenchRun(
        bootstrap,
        MODES[mode],
        size=int(options["size"]),  # type: ignore[call-overload]
        concurrency=int(options["concurrency"]),  # type: ignore[call-overload]
        in_flight=int(options["in_flight"]),  # type: ignore[call-overload]
        keep_topics=bool(options["keep_topics"]),
        client=client,
    )
    if options["producers"] is not None:
        run.env.producers = int(options["producers"])  # type: ignore[call-overload]
    run.rocketmq = RocketMQOptions(
        endpoint=options["rocketmq_endpoint"],  # type: ignore[arg-type]
        namesrv=options["rocketmq_namesrv"],  # type: ignore[arg-type]
        cluster=str(options["rocketmq_cluster"]),
        keep_topics=bool(options["keep_topics"]),
    )
    started = time.monotonic()
    only = set(options["only"] or STEPS) - set(options["skip"])  # type: ignore[call-overload]
    run.selected = frozenset(only)
    skipped: dict[str, str] = {}
    with run:
        for step in STEPS:
            if step not in only:
                continue
            run.progress = functools.partial(_progress, console, step)
            before = len(run.figures)
            with console.status(f"[bold]{step}[/] ..."):
                try:
                    run.step(step)
                except StepSkipped as reason:
                    skipped[step] = str(reason)
                    console.print(f"  {step}: skipped: {reason}")
                    continue
            for figure in run.figures[before:]:
                name, value = next(iter(figure.values.items()))
                console.print(f"  {figure.name}: {name} = {value:,.2f}")
    console.print(results.render(run.figures))
    out = Path(options["out"])  # type: ignore[arg-type]
    some_steps = only != set(STEPS)
    path = results.write_json(
        run.figures, out, mode=mode, bootstrap=bootstrap, skipped=skipped, some_steps=some_steps
    )
    latest = out / f"latest-{mode}.md"
    if not some_steps:
        latest.write_text(results.markdown(run.figures, results.machine()))
    else:  # some steps only: the last whole run's summary stays
        console.print(f"{latest} left as it was (not every step ran)")
    console.print(f"results: {path} ({time.monotonic() - started:.0f}s); logs in {run.env.work}")


def _progress(console: Any, step: str, line: str) -> None:
    console.print(f"  [dim]{step}: {line}[/]")
