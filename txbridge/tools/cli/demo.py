"""``txbridge demo`` and ``txbridge report``: the side-by-side run and its report.

The pipelines themselves are :mod:`spark_pipelines`, imported when a command runs (they need the
``spark`` extra).
"""

from __future__ import annotations

import dataclasses
import secrets
import signal
import threading
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from txbridge.tools.cli.options import bootstrap_option, client_options, one_line_errors, resolve_bootstrap

if TYPE_CHECKING:
    from rich.console import Console

    from spark_pipelines.faults import FaultPlan
    from spark_pipelines.rocketmq import RocketMQSetup, RocketMQTarget
    from spark_pipelines.runner import WorkloadResult
    from spark_pipelines.streaming import CustomerCounts
    from spark_pipelines.workload import RunConfig
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


def _broker_was_running() -> bool:
    from txbridge.tools.local.broker import LocalKafka

    return LocalKafka.from_home().status().running


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


def _rocketmq_setup(
    topic: str, group: str, endpoint: str | None, namesrv: str | None, cluster: str
) -> RocketMQSetup:
    """The RocketMQ side of the run (not started): an existing one, checked now, or a local one.

    Raises:
        ConfigurationError: only one of the two endpoints, one is malformed or nothing listens
            there, or the RocketMQ client is not installed.
    """
    from spark_pipelines.paths.rocketmq_path import _import_rocketmq
    from spark_pipelines.rocketmq import RocketMQSetup, RocketMQTarget, demo_rocketmq
    from txbridge.errors import ConfigurationError

    _import_rocketmq()  # before anything starts
    if endpoint or namesrv:
        if not (endpoint and namesrv):
            raise ConfigurationError(
                "an existing RocketMQ needs both --rocketmq-endpoint (its proxy, gRPC) and "
                "--rocketmq-namesrv (its name server, to create the run's topic)"
            )
        return RocketMQSetup(topic, group, existing=RocketMQTarget.existing(endpoint, namesrv, cluster))
    return RocketMQSetup(topic, group, local=demo_rocketmq())


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
@one_line_errors
@_sigterm_exits
def demo(  # noqa: PLR0912, PLR0915 - the demo's steps read best in one place
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
    paths_option: str,
    rocketmq_endpoint: str | None,
    rocketmq_namesrv: str | None,
    rocketmq_cluster: str,
) -> None:
    """Run the same faulty order workload through txbridge, native Kafka transactions, plain
    produce and Apache RocketMQ's transactional messages, compare them in Spark, print the
    table and write the report.

    RocketMQ is a local one the demo starts and stops, unless --rocketmq-endpoint and
    --rocketmq-namesrv name an existing one; --paths txbridge,native,plain skips it.
    With --command-config (a secured cluster), every Kafka path, the coordinator, the
    watchers and Spark's Kafka source connect with the same client settings."""
    from rich.console import Console
    from rich.progress import Progress

    from spark_pipelines.faults import FaultPlan, FaultRates
    from spark_pipelines.processes import coordinator_process
    from spark_pipelines.runner import prepare, run_workload
    from spark_pipelines.workload import RunConfig, new_run_id
    from txbridge.errors import ConfigurationError

    paths = _parse_paths(paths_option)
    try:
        rates = FaultRates(local_fail_rate, unknown_rate, crash_rate, crash_rate)
    except ValueError as exc:
        raise ConfigurationError(f"fault rates: {exc}; lower --*-rate") from exc
    console = Console(width=max(Console().width, 150))  # the table has 13 columns
    run_id = new_run_id()
    setup = None
    if "rocketmq" in paths:
        # Started first: RocketMQ's cold start (11-34 s) overlaps Kafka's and Spark's.
        setup = _rocketmq_setup(
            f"orders-{run_id}-rocketmq",
            f"watcher-{run_id}",
            rocketmq_endpoint,
            rocketmq_namesrv,
            rocketmq_cluster,
        ).start()
    elif rocketmq_endpoint or rocketmq_namesrv:
        console.print("--paths leaves rocketmq out: --rocketmq-endpoint/--rocketmq-namesrv are not used")
    started_broker = False
    coordinator = None
    stream = None
    try:
        started_broker = not (bootstrap or client.bootstrap) and not _broker_was_running()
        bootstrap = resolve_bootstrap(bootstrap, start_local=True, client=client)
        client.java()  # Spark's Kafka source takes them too: a setting it cannot take fails before the run
        run_dir = Path(out).resolve() / run_id
        config = RunConfig.create(run_id, bootstrap, run_dir, db_url=db_url, check_after=check_delay)
        plan = FaultPlan.generate(
            seed,
            orders,
            customers=customers,
            rates=rates,
            every_fault=orders >= 10,
            kill_coordinator=not no_coordinator_kill and "txbridge" in paths,
        )
        secret = secrets.token_hex(16)
        began = time.monotonic()
        prepare(config, paths, client=client)
        if "txbridge" in paths:
            coordinator = coordinator_process(config, secret, check_delay=check_delay, client=client)
            coordinator.start()
        console.print(
            f"run {run_id}: {orders} orders x {len(paths)} paths ({', '.join(paths)}), seed {seed}, "
            f"Kafka {bootstrap}"
        )
        if streaming and "txbridge" in paths:
            from spark_pipelines.session import build_session
            from spark_pipelines.streaming import CustomerCounts

            spark = build_session("txbridge-demo", master=master)
            spark.sparkContext.setLogLevel("ERROR")  # spark-avro warns per batch about nullability
            stream = CustomerCounts(
                spark, bootstrap, config.topics["txbridge"], run_dir / "stream", client=client
            )
            stream.start()
        if coordinator is not None:
            coordinator.wait_ready()  # a coordinator that cannot start fails the run here, with its log
        target = None
        if setup is not None:
            with console.status("waiting for RocketMQ ..."):
                target = setup.wait()  # RocketMQ that cannot start fails the run here, saying why
            config = dataclasses.replace(config, rocketmq_endpoint=target.endpoint)
            took = f", started in {target.start_s:.0f}s" if target.start_s is not None else ""
            console.print(f"RocketMQ at {target.endpoint} (name server {target.namesrv}{took})")
        with Progress(console=console, transient=False) as progress:
            bars = {p: progress.add_task(p, total=orders) for p in paths}
            restart_at = orders // 3
            restarts: list[threading.Thread] = []

            def on_order(path: str, index: int, _outcome: str) -> None:
                progress.advance(bars[path])
                if stream is not None and path == "txbridge" and index == restart_at:
                    # In a thread: this one follows the txbridge producers (their crashes, the
                    # coordinator kill), which must not wait for Spark to restart a query.
                    restart = threading.Thread(target=stream.restart, name="stream-restart")
                    restart.start()
                    restarts.append(restart)

            result = run_workload(
                config,
                plan,
                secret=secret,
                coordinator=coordinator,
                paths=paths,
                quiet_s=_quiet_s(setup),
                on_order=on_order,
                client=client,
            )
            for restart in restarts:
                restart.join()
        console.print(f"workload done in {time.monotonic() - began:.0f}s; Spark comparison ...")
        report = _compare_and_report(
            config,
            plan,
            result,
            stream,
            paths=paths,
            rocketmq=_rocketmq_facts(setup, target, config, result) if setup is not None else None,
            master=master,
            console=console,
            client=client,
        )
        console.print(f"report: {report}")
    finally:
        if stream is not None:
            stream.stop()
        if coordinator is not None:
            coordinator.stop()
        if setup is not None:
            setup.stop()
        if started_broker and not keep_broker:
            from txbridge.tools.local.broker import LocalKafka

            LocalKafka.from_home().stop()


def _quiet_s(setup: RocketMQSetup | None) -> float:
    """How long to keep watching once every order is visible: with RocketMQ, one check interval
    more, so a transaction checked again after its commit shows up as delivered twice."""
    if setup is None:
        return 1.0
    return min(setup.check_interval_s(), 30.0) + 1.0


def _rocketmq_facts(
    setup: RocketMQSetup, target: RocketMQTarget | None, config: RunConfig, result: WorkloadResult
) -> dict[str, Any]:
    from spark_pipelines.paths.rocketmq_path import summarize
    from spark_pipelines.rocketmq import DEMO_TRANSACTION_SETTINGS, ROCKETMQ_DEFAULTS
    from spark_pipelines.watcher import load_received
    from txbridge.tools.local.jars import ROCKETMQ_VERSION

    started = target is not None and target.local is not None
    facts: dict[str, Any] = {
        "started_by_demo": started,
        "endpoint": target.endpoint if target else None,
        "namesrv": target.namesrv if target else None,
        "start_s": round(target.start_s, 1) if target and target.start_s is not None else None,
        "version": ROCKETMQ_VERSION if started else "as deployed",
        "transaction_settings": setup.finish(),
        "rocketmq_defaults": ROCKETMQ_DEFAULTS,
    }
    if started:
        changed = [k for k, v in DEMO_TRANSACTION_SETTINGS.items() if ROCKETMQ_DEFAULTS.get(k) != v]
        facts["settings_reason"] = (
            f"RocketMQ {ROCKETMQ_VERSION}'s defaults but for {', '.join(changed)}: a service that relies "
            "on checks to finish what a crashed producer left open lowers the check interval from "
            "30 s; every other setting is the default. See docs/demo.md."
        )
    facts["consumer"] = "SimpleConsumer, its own group, ack after recording (at-least-once, no dedup)"
    facts["watcher"] = result.rocketmq_watcher
    received = result.received.get("rocketmq")
    records = load_received(received) if received else []
    facts.update(summarize(Path(config.run_dir) / "logs", records))
    return facts


def _compare_and_report(
    config: RunConfig,
    plan: FaultPlan,
    result: WorkloadResult,
    stream: CustomerCounts | None,
    *,
    paths: tuple[str, ...],
    rocketmq: dict[str, Any] | None,
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
    truth = {p: config.store(p).committed() for p in paths}
    visibility = {key: load_visibility(file) for key, file in result.visibility.items()}
    kafka_topics = config.topics_for([p for p in paths if p not in result.received])
    metrics, samples = compare(
        spark,
        config.bootstrap,
        kafka_topics,
        truth,
        visibility=visibility,
        client=client,
        received=result.received,
    )
    info: dict[str, object] = {
        "run_id": config.run_id,
        "paths": ", ".join(paths),
        "orders": len(plan.orders),
        "seed": plan.seed,
        "faults": {k.value: plan.count(k) for k in Fault},
        "producer_kills": {p: len(r.crashes) for p, r in result.paths.items()},
        "coordinator_kills": result.coordinator_kills,
        "settled": {p: not missing for p, missing in result.unsettled.items()},
        "settle_s": round(result.settle_s, 1),
    }
    skipped = [p for p in _ALL_PATHS if p not in paths]
    if skipped:
        info["skipped"] = {p: "left out with --paths" for p in skipped}
    if rocketmq is not None:
        info["rocketmq"] = rocketmq
    if result.coordinator_exits:
        # Exits the plan did not cause (the watchdog's 75, a crash): the run started it again.
        info["coordinator_exits"] = result.coordinator_exits
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
@one_line_errors
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
