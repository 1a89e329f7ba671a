"""``txbridge demo`` and ``txbridge report``: the side-by-side run and its report.

Registered by txbridge.cli (``_PLUGINS``); the demo replaces the smoke placeholder.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from txbridge.cli import _one_line_errors, bootstrap_option, client_options, resolve_bootstrap

if TYPE_CHECKING:
    from rich.console import Console

    from spark_pipelines.faults import FaultPlan
    from spark_pipelines.runner import WorkloadResult
    from spark_pipelines.streaming import CustomerCounts
    from spark_pipelines.workload import RunConfig
    from txbridge.client_config import ClientConfig


def _broker_was_running() -> bool:
    from txbridge.local.broker import LocalKafka

    return LocalKafka.from_home().status().running


@click.command()
@bootstrap_option
@client_options
@click.option("--orders", default=600, show_default=True, help="Orders per path.")
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
@_one_line_errors
def demo(  # noqa: PLR0915 - the demo's steps read best in one place
    *,
    bootstrap: str | None,
    client: ClientConfig,
    orders: int,
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
) -> None:
    """Run the same faulty order workload through txbridge, native Kafka transactions and plain
    produce, compare them in Spark, print the table and write the report.

    With --command-config (a secured cluster), every path, the coordinator, the watchers and
    Spark's Kafka source connect with the same client settings."""
    from rich.console import Console
    from rich.progress import Progress

    from spark_pipelines.faults import FaultPlan, FaultRates
    from spark_pipelines.processes import coordinator_process
    from spark_pipelines.runner import prepare, run_workload
    from spark_pipelines.workload import RunConfig, new_run_id
    from txbridge.errors import ConfigurationError

    try:
        rates = FaultRates(local_fail_rate, unknown_rate, crash_rate, crash_rate)
    except ValueError as exc:
        raise ConfigurationError(f"fault rates: {exc}; lower --*-rate") from exc
    console = Console(width=max(Console().width, 150))  # the table has 13 columns
    started_broker = not (bootstrap or client.bootstrap) and not _broker_was_running()
    bootstrap = resolve_bootstrap(bootstrap, start_local=True, client=client)
    client.java()  # Spark's Kafka source takes them too: a setting it cannot take fails before the run
    run_id = new_run_id()
    run_dir = Path(out).resolve() / run_id
    config = RunConfig.create(run_id, bootstrap, run_dir, db_url=db_url, check_after=check_delay)
    plan = FaultPlan.generate(
        seed,
        orders,
        customers=customers,
        rates=rates,
        every_fault=orders >= 10,
        kill_coordinator=not no_coordinator_kill,
    )
    secret = secrets.token_hex(16)
    coordinator = coordinator_process(config, secret, check_delay=check_delay, client=client)
    stream = None
    began = time.monotonic()
    try:
        prepare(config, client=client)
        coordinator.start()
        console.print(f"run {run_id}: {orders} orders x 3 paths, seed {seed}, Kafka {bootstrap}")
        spark = None
        if streaming:
            from spark_pipelines.session import build_session
            from spark_pipelines.streaming import CustomerCounts

            spark = build_session("txbridge-demo", master=master)
            spark.sparkContext.setLogLevel("ERROR")  # spark-avro warns per batch about nullability
            stream = CustomerCounts(
                spark, bootstrap, config.topics["txbridge"], run_dir / "stream", client=client
            )
            stream.start()
        coordinator.wait_ready()  # a coordinator that cannot start fails the run here, with its log
        with Progress(console=console, transient=False) as progress:
            bars = {p: progress.add_task(p, total=orders) for p in config.topics}
            restart_at = orders // 3

            def on_order(path: str, index: int, _outcome: str) -> None:
                progress.advance(bars[path])
                if stream is not None and path == "txbridge" and index == restart_at:
                    stream.restart()

            result = run_workload(
                config, plan, secret=secret, coordinator=coordinator, on_order=on_order, client=client
            )
        console.print(f"workload done in {time.monotonic() - began:.0f}s; Spark comparison ...")
        report = _compare_and_report(
            config, plan, result, stream, master=master, console=console, client=client
        )
        console.print(f"report: {report}")
    finally:
        if stream is not None:
            stream.stop()
        coordinator.stop()
        if started_broker and not keep_broker:
            from txbridge.local.broker import LocalKafka

            LocalKafka.from_home().stop()


def _compare_and_report(
    config: RunConfig,
    plan: FaultPlan,
    result: WorkloadResult,
    stream: CustomerCounts | None,
    *,
    master: str | None,
    console: Console,
    client: ClientConfig,
) -> Path:
    from spark_pipelines.compare import compare
    from spark_pipelines.faults import Fault
    from spark_pipelines.report import table, write_report
    from spark_pipelines.session import build_session
    from spark_pipelines.watcher import load_visibility

    spark = build_session("txbridge-demo", master=master)
    spark.sparkContext.setLogLevel("ERROR")
    truth = {p: config.store(p).committed() for p in config.topics}
    visibility = {key: load_visibility(file) for key, file in result.visibility.items()}
    metrics, samples = compare(
        spark, config.bootstrap, config.topics, truth, visibility=visibility, client=client
    )
    info: dict[str, object] = {
        "run_id": config.run_id,
        "orders": len(plan.orders),
        "seed": plan.seed,
        "faults": {k.value: plan.count(k) for k in Fault},
        "producer_kills": {p: len(r.crashes) for p, r in result.paths.items()},
        "coordinator_kills": result.coordinator_kills,
        "txbridge_settled": result.settled,
        "settle_s": round(result.settle_s, 1),
    }
    if result.coordinator_outages:
        # The restarted coordinator's downtime (SIGKILL -> partitions assigned again; the demo waits
        # 1 s before restarting, as a supervisor would) and the txbridge orders committed meanwhile.
        outages = result.coordinator_outages
        committed_ms = [order.committed_ms for order in truth.get("txbridge", [])]
        info["coordinator_downtime_s"] = [round(ready - killed, 2) for killed, ready in outages]
        info["orders_committed_while_coordinator_down"] = sum(
            any(killed * 1000 <= ms <= ready * 1000 for killed, ready in outages) for ms in committed_ms
        )
    if stream is not None:
        stream.catch_up()
        counts = stream.counts()
        per_customer: dict[str, int] = {}
        for order in truth["txbridge"]:
            per_customer[order.customer_id] = per_customer.get(order.customer_id, 0) + 1
        info["streaming_restarts"] = stream.starts - 1
        info["streaming_counts_equal_db"] = counts == per_customer
    console.print(table(metrics))
    return write_report(Path(config.run_dir), metrics, samples, info)


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_one_line_errors
def report(run_dir: Path) -> None:
    """Print a finished run's table again and re-write its report (from RUN_DIR/metrics.json)."""
    from rich.console import Console

    from spark_pipelines.report import load_metrics, table, write_report
    from txbridge.errors import ConfigurationError

    try:
        metrics, samples, info = load_metrics(run_dir)
    except FileNotFoundError:
        raise ConfigurationError(f"{run_dir} has no metrics.json: pass a reports/<run-id> folder") from None
    Console(width=max(Console().width, 150)).print(table(metrics))
    click.echo(f"report: {write_report(run_dir, metrics, samples, info)}")
