"""``txbridge spark start|stop|status``: a local Spark standalone cluster for ``--master``."""

from __future__ import annotations

import sys
import time

import click

from servers import spark_cluster as local
from txbridge.settings import one_line_errors


@click.group()
def spark() -> None:
    """A local Spark standalone cluster (a master and its workers) from pyspark's own Spark."""


@spark.command("start")
@click.option("--workers", default=2, show_default=True, help="How many workers.")
@click.option("--master-port", default=local.DEFAULT_MASTER_PORT, show_default=True, help="Master RPC port.")
@click.option("--webui-port", default=local.DEFAULT_WEBUI_PORT, show_default=True, help="Master web UI port.")
@click.option("--worker-cores", default=1, show_default=True, help="Cores each worker offers.")
@click.option(
    "--worker-memory",
    default="1g",
    show_default=True,
    help="Memory each worker offers to executors (at least spark.executor.memory, 1g by default).",
)
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for every worker.")
@one_line_errors
def spark_start(
    *, workers: int, master_port: int, webui_port: int, worker_cores: int, worker_memory: str, timeout: float
) -> None:
    """Start the master and the workers in the background."""
    cluster = local.LocalSparkCluster(
        workers=workers,
        master_port=master_port,
        webui_port=webui_port,
        worker_cores=worker_cores,
        worker_memory=worker_memory,
    )
    started = time.monotonic()
    status = cluster.start(timeout=timeout)
    click.echo(
        f"Spark is up: {status.master_url} with {status.alive_workers} workers "
        f"({time.monotonic() - started:.1f}s); web UI {status.webui_url}"
    )
    click.echo(f"use it: txbridge demo --master {status.master_url}  (or TXBRIDGE_SPARK_MASTER)")
    click.echo(f"logs: {status.log_dir}")


@spark.command("stop")
@one_line_errors
def spark_stop() -> None:
    """Stop the workers (and their executors) and the master."""
    if local.LocalSparkCluster.from_home().stop():
        click.echo("stopped")
    else:
        click.echo("no local Spark cluster was running")


@spark.command("status")
@one_line_errors
def spark_status() -> None:
    """Say whether the master and the workers run, where, and their memory."""
    cluster = local.LocalSparkCluster.from_home()
    status = cluster.status()
    if status.master_pid is None and not any(status.worker_pids):
        click.echo("local Spark cluster: not running (start it with 'txbridge spark start')")
        sys.exit(1)
    alive = "?" if status.alive_workers is None else status.alive_workers
    click.echo(
        f"local Spark cluster: {'running' if status.running else 'PARTLY DOWN'} at {status.master_url}, "
        f"{alive} of {len(status.worker_pids)} workers alive; logs {status.log_dir}"
    )
    pids = {"master": status.master_pid} | {f"worker-{n}": pid for n, pid in enumerate(status.worker_pids, 1)}
    for name, pid in pids.items():
        if pid is None:
            click.echo(f"  {name}: not running")
        else:
            rss = status.rss_bytes.get(name)
            memory = f", RSS {rss / 2**20:.0f} MiB" if rss else ""
            if memory and name != "master":
                memory += " with its executors"
            click.echo(f"  {name}: pid {pid}{memory}")
    if not status.running:
        sys.exit(1)
