"""``txbridge demo`` and ``txbridge report``: the side-by-side run and its report.

The pipelines themselves are :mod:`spark_pipelines`, imported when a command runs (they need the
``spark`` extra).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

#: Every path (spark_pipelines.paths.ALL_PATHS, not imported: the CLI loads its modules lazily).
_ALL_PATHS = ("txbridge", "native", "plain", "rocketmq")


F = TypeVar("F", bound=Callable[..., Any])


def _sigterm_exits(func: F) -> F:
    """SIGTERM (a CI timeout, ``kill``) ends the command as Ctrl-C does: its clean-up runs, so the
    brokers and processes it started are stopped instead of left running."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return func(*args, **kwargs)

        def exit_now(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        previous = signal.signal(signal.SIGTERM, exit_now)
        try:
            return func(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


def _parse_paths(value: str) -> tuple[str, ...]:
    """``--paths``: names from ``_ALL_PATHS``, comma-separated, returned in the report's order.

    Raises:
        ConfigurationError: an unknown name, or none.
    """
    from txbridge.errors import ConfigurationError

    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in _ALL_PATHS]
    if unknown or not names:
        raise ConfigurationError(
            f"--paths {value!r}: {'unknown path ' + ', '.join(unknown) if unknown else 'no path'}; "
            f"choose from {','.join(_ALL_PATHS)}"
        )
    return tuple(p for p in _ALL_PATHS if p in names)


@click.command()
@bootstrap_option
@client_options
@click.option("--orders", default=600, show_default=True, help="Orders per path.")
@click.option(
    "--rate",
    default=10.0,
    show_default=True,
    help="Orders per second of each path, paced from their common start (0: each as fast as it can, "
    "which saturates a small machine and measures its queues rather than the paths).",
)
@click.option("--customers", default=20, show_default=True, help="Distinct customers (message keys).")
@click.option("--seed", default=42, show_default=True, help="Seed of the fault plan (same seed, same plan).")
@click.option(
    "--local-fail-rate", default=0.05, show_default=True, help="Share of local transactions that fail."
)
@click.option(
    "--unknown-rate", default=0.03, show_default=True, help="Share of outcomes the producer never learns."
)
@click.option(
    "--crash-rate", default=0.005, show_default=True, help="Share of orders at each of the 2 crash points."
)
@click.option("--no-coordinator-kill", is_flag=True, help="Do not SIGKILL the coordinator mid-run.")
@click.option("--streaming/--no-streaming", default=True, show_default=True, help="Run the streaming count.")
@click.option("--master", default=None, help="Spark master URL (default local[2]).")
@click.option(
    "--db-url", default="", help="SQLAlchemy URL of the order DB (default: one SQLite file per path)."
)
@click.option(
    "--out", default="reports", show_default=True, type=click.Path(file_okay=False), help="Report root."
)
@click.option("--check-delay", default=2.0, show_default=True, help="Seconds before the first back-check.")
@click.option("--keep-broker", is_flag=True, help="Leave the local broker running if the demo started it.")
@click.option(
    "--paths",
    "paths_option",
    default=",".join(_ALL_PATHS),
    show_default=True,
    help="The paths to run, comma-separated; leave rocketmq out to skip RocketMQ.",
)
@click.option(
    "--rocketmq-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="gRPC endpoint of an existing RocketMQ 5 proxy (default: the demo starts a local RocketMQ).",
)
@click.option(
    "--rocketmq-namesrv",
    default=None,
    metavar="HOST:PORT",
    help="Name server of that RocketMQ (the run's topic is created through it).",
)
@click.option(
    "--rocketmq-cluster",
    default="DefaultCluster",
    show_default=True,
    help="Broker cluster of that RocketMQ that gets the run's topic.",
)
@click.option(
    "--spark-sink/--no-spark-sink",
    default=True,
    show_default=True,
    help="Run the fifth comparison: Spark as the producer, its Kafka sink vs txbridge's "
    "(needs the txbridge path).",
)
@click.option(
    "--spark-sink-rows", default=240, show_default=True, help="Rows each Spark sink writes (at least 150)."
)
@one_line_errors
@_sigterm_exits
def demo(
    *,
    bootstrap: str | None,
    client: ClientConfig,
    orders: int,
    rate: float,
    customers: int,
    seed: int,
    local_fail_rate: float,
    unknown_rate: float,
    crash_rate: float,
    no_coordinator_kill: bool,
    streaming: bool,
    master: str | None,
    db_url: str,
    out: str,
    check_delay: float,
    keep_broker: bool,
    paths_option: str,
    rocketmq_endpoint: str | None,
    rocketmq_namesrv: str | None,
    rocketmq_cluster: str,
    spark_sink: bool,
    spark_sink_rows: int,
) -> None:
    """Run the same faulty order workload through txbridge, native Kafka transactions, plain
    produce and Apache RocketMQ's transactional messages, compare them in Spark, print the
    table and write the report.

    RocketMQ is a local one the demo starts and stops, unless --rocketmq-endpoint and
    --rocketmq-namesrv name an existing one; --paths txbridge,native,plain skips it.
    With --command-config (a secured cluster), every Kafka path, the coordinator, the
    watchers and Spark's Kafka source connect with the same client settings."""
    from rich.console import Console

    from spark_pipelines.demo import DemoOptions, fault_rates, run_demo

    paths = _parse_paths(paths_option)
    options = DemoOptions(
        client=client,
        bootstrap=bootstrap,
        orders=orders,
        rate=rate,
        customers=customers,
        seed=seed,
        rates=fault_rates(local_fail_rate, unknown_rate, crash_rate),
        kill_coordinator=not no_coordinator_kill,
        streaming=streaming,
        master=master,
        db_url=db_url,
        out=Path(out),
        check_delay=check_delay,
        keep_broker=keep_broker,
        paths=paths,
        rocketmq_endpoint=rocketmq_endpoint,
        rocketmq_namesrv=rocketmq_namesrv,
        rocketmq_cluster=rocketmq_cluster,
        spark_sink=spark_sink,
        spark_sink_rows=spark_sink_rows,
    )
    console = Console(width=max(Console().width, 150))  # the table has 13 columns
    run_demo(
        options,
        resolve_kafka=lambda: resolve_bootstrap(bootstrap, start_local=True, client=client),
        console=console,
    )


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@one_line_errors
def report(run_dir: Path) -> None:
    """Print a finished run's table again and re-write its report (from RUN_DIR/metrics.json)."""
    from rich.console import Console

    from spark_pipelines.report import load_metrics, summary_lines, table, write_report
    from txbridge.errors import ConfigurationError

    try:
        metrics, samples, info = load_metrics(run_dir)
    except FileNotFoundError:
        raise ConfigurationError(f"{run_dir} has no metrics.json: pass a reports/<run-id> folder") from None
    console = Console(width=max(Console().width, 150))
    console.print(table(metrics))
    for line in summary_lines(metrics, info):
        console.print(line)
    click.echo(f"report: {write_report(run_dir, metrics, samples, info)}")
