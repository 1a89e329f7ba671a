"""The side-by-side demo, start to end: servers, the workload, the Spark comparison, the report.

``txbridge demo`` parses its options into :class:`DemoOptions` and calls :func:`run_demo`;
everything the run starts (RocketMQ, the local broker, the coordinator, the streaming query)
is stopped again at the end, also when it fails. ``txbridge report`` re-renders a finished run
(:mod:`spark_pipelines.report`).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_pipelines.faults import Fault, FaultPlan, FaultRates
from spark_pipelines.paths import ALL_PATHS
from spark_pipelines.processes import coordinator_process
from spark_pipelines.runner import WorkloadResult, prepare, run_workload
from spark_pipelines.workload import RunConfig, new_run_id
from txbridge.errors import ConfigurationError

if TYPE_CHECKING:
    from rich.console import Console

    from servers.coordinator_process import CoordinatorProcess
    from spark_pipelines.rocketmq import RocketMQSetup, RocketMQTarget
    from spark_pipelines.streaming import CustomerCounts
    from txbridge.client_config import ClientConfig


@dataclass(frozen=True)
class DemoOptions:
    """What one demo run does (``txbridge demo``'s options; docs/demo.md).

    Attributes:
        client: the cluster's client settings (every path, the coordinator, Spark's Kafka source).
        bootstrap: Kafka bootstrap servers as given (None: the client file's, else the local broker).
        orders: orders per path.
        rate: orders per second of each path, paced from their common start. 0: each as fast as
            it can; on a small machine the paths then saturate it together and their latencies
            measure its queues, and they drift apart, so each is measured at other moments.
        customers: distinct customers (message keys).
        seed: seed of the fault plan.
        rates: the share of orders of each fault kind.
        kill_coordinator: SIGKILL the coordinator once mid-run.
        streaming: run the streaming count over the txbridge topic, restarted once.
        master: the Spark master (None: ``$TXBRIDGE_SPARK_MASTER`` or ``local[2]``).
        db_url: the order databases' SQLAlchemy URL ("" : one SQLite file per path).
        out: the report root; the run writes ``out/<run-id>/``.
        check_delay: seconds before the first back-check.
        keep_broker: leave the local broker running if the run started it.
        paths: the paths to run, in the report's order.
        rocketmq_endpoint: an existing RocketMQ's proxy (None: the demo starts its own).
        rocketmq_namesrv: that RocketMQ's name server.
        rocketmq_cluster: that RocketMQ's broker cluster.
        spark_sink: run the fifth comparison, Spark as the producer (needs the txbridge path).
        spark_sink_rows: the rows each Spark sink writes.
    """

    client: ClientConfig
    bootstrap: str | None = None
    orders: int = 600
    rate: float = 10.0
    customers: int = 20
    seed: int = 42
    rates: FaultRates = dataclasses.field(default_factory=FaultRates)
    kill_coordinator: bool = True
    streaming: bool = True
    master: str | None = None
    db_url: str = ""
    out: Path = Path("reports")
    check_delay: float = 2.0
    keep_broker: bool = False
    paths: tuple[str, ...] = ALL_PATHS
    rocketmq_endpoint: str | None = None
    rocketmq_namesrv: str | None = None
    rocketmq_cluster: str = "DefaultCluster"
    spark_sink: bool = True
    spark_sink_rows: int = 240


@dataclass
class _Running:
    """What a run has started, stopped again by :func:`run_demo` whatever happens."""

    setup: RocketMQSetup | None = None
    started_broker: bool = False
    coordinator: CoordinatorProcess | None = None
    stream: CustomerCounts | None = None


def fault_rates(local_fail: float, unknown: float, crash: float) -> FaultRates:
    """The run's fault rates (``crash`` at each of the two crash points).

    Raises:
        ConfigurationError: negative rates, or rates summing above 1.
    """
    try:
        return FaultRates(local_fail, unknown, crash, crash)
    except ValueError as exc:
        raise ConfigurationError(f"fault rates: {exc}; lower --*-rate") from exc


def rocketmq_setup(
    topic: str, group: str, endpoint: str | None, namesrv: str | None, cluster: str
) -> RocketMQSetup:
    """The RocketMQ side of the run (not started): an existing one, checked now, or a local one.

    Raises:
        ConfigurationError: only one of the two endpoints, one is malformed or nothing listens
            there, or the RocketMQ client is not installed.
    """
    from spark_pipelines.paths.rocketmq_path import _import_rocketmq
    from spark_pipelines.rocketmq import RocketMQSetup, RocketMQTarget, demo_rocketmq

    _import_rocketmq()  # before anything starts
    if endpoint or namesrv:
        if not (endpoint and namesrv):
            raise ConfigurationError(
                "an existing RocketMQ needs both --rocketmq-endpoint (its proxy, gRPC) and "
                "--rocketmq-namesrv (its name server, to create the run's topic)"
            )
        return RocketMQSetup(topic, group, existing=RocketMQTarget.existing(endpoint, namesrv, cluster))
    return RocketMQSetup(topic, group, local=demo_rocketmq())


def _local_broker_running() -> bool:
    from servers.broker import LocalKafka

    return LocalKafka.from_home().status().running


def run_demo(options: DemoOptions, *, resolve_kafka: Callable[[], str], console: Console) -> Path:
    """Run the demo and write its report; return the report's path.

    Args:
        options: the run.
        resolve_kafka: returns the bootstrap servers to use, starting the local broker when
            none is given (the CLI's ``resolve_bootstrap``); called after RocketMQ's start.
        console: where the progress, the table and the report's path are printed.
    """
    if options.rate < 0:
        raise ConfigurationError(
            f"--rate {options.rate}: give orders per second, or 0 for as fast as each path can"
        )
    if options.spark_sink and "txbridge" in options.paths:
        from spark_pipelines.sink_compare import min_rows

        if options.spark_sink_rows < min_rows():
            raise ConfigurationError(
                f"--spark-sink-rows {options.spark_sink_rows}: needs at least {min_rows()}"
            )
    run_id = new_run_id()
    running = _Running()
    if "rocketmq" in options.paths:
        # Started first: RocketMQ's cold start, the slowest, overlaps Kafka's and Spark's.
        running.setup = rocketmq_setup(
            f"orders-{run_id}-rocketmq",
            f"watcher-{run_id}",
            options.rocketmq_endpoint,
            options.rocketmq_namesrv,
            options.rocketmq_cluster,
        ).start()
    elif options.rocketmq_endpoint or options.rocketmq_namesrv:
        console.print("--paths leaves rocketmq out: --rocketmq-endpoint/--rocketmq-namesrv are not used")
    try:
        running.started_broker = (
            not (options.bootstrap or options.client.bootstrap) and not _local_broker_running()
        )
        bootstrap = resolve_kafka()
        options.client.java()  # Spark's Kafka source takes them too: a setting it cannot take fails now
        return _run(options, run_id, bootstrap, running, console)
    finally:
        _stop(options, running)


def _stop(options: DemoOptions, running: _Running) -> None:
    if running.stream is not None:
        running.stream.stop()
    if running.coordinator is not None:
        running.coordinator.stop()
    if running.setup is not None:
        running.setup.stop()
    if running.started_broker and not options.keep_broker:
        from servers.broker import LocalKafka

        LocalKafka.from_home().stop()


def _run(options: DemoOptions, run_id: str, bootstrap: str, running: _Running, console: Console) -> Path:
    """The run once Kafka is there: topics, coordinator, streaming query, workload, report."""
    paths = options.paths
    run_dir = options.out.resolve() / run_id
    config = RunConfig.create(
        run_id, bootstrap, run_dir, db_url=options.db_url, check_after=options.check_delay, rate=options.rate
    )
    plan = FaultPlan.generate(
        options.seed,
        options.orders,
        customers=options.customers,
        rates=options.rates,
        every_fault=options.orders >= 10,
        kill_coordinator=options.kill_coordinator and "txbridge" in paths,
    )
    secret = secrets.token_hex(16)
    began = time.monotonic()
    prepare(config, paths, client=options.client)
    if "txbridge" in paths:
        running.coordinator = coordinator_process(
            config, secret, check_delay=options.check_delay, client=options.client
        )
        running.coordinator.start()
    console.print(
        f"run {run_id}: {options.orders} orders x {len(paths)} paths ({', '.join(paths)}), "
        f"seed {options.seed}, Kafka {bootstrap}"
    )
    if options.streaming and "txbridge" in paths:
        running.stream = _start_stream(options, config)
    if running.coordinator is not None:
        running.coordinator.wait_ready()  # a coordinator that cannot start fails the run here, with its log
    target = None
    if running.setup is not None:
        with console.status("waiting for RocketMQ ..."):
            target = running.setup.wait()  # RocketMQ that cannot start fails the run here, saying why
        config = dataclasses.replace(config, rocketmq_endpoint=target.endpoint)
        took = f", started in {target.start_s:.0f}s" if target.start_s is not None else ""
        console.print(f"RocketMQ at {target.endpoint} (name server {target.namesrv}{took})")
    if running.stream is not None:
        # Its first batch (Spark plans and compiles the query) is the costliest moment of the
        # streaming count: it must not fall on the first orders of every path.
        running.stream.catch_up()
    result = _workload(options, config, plan, secret=secret, running=running, console=console)
    console.print(f"workload done in {time.monotonic() - began:.0f}s; Spark comparison ...")
    rocketmq = None
    if running.setup is not None:
        rocketmq = _rocketmq_facts(running.setup, target, config, result)
    report = _compare_and_report(
        options,
        config,
        plan,
        result,
        secret=secret,
        stream=running.stream,
        rocketmq=rocketmq,
        console=console,
    )
    console.print(f"report: {report}")
    return report


def _start_stream(options: DemoOptions, config: RunConfig) -> CustomerCounts:
    from spark_pipelines.session import build_session
    from spark_pipelines.streaming import CustomerCounts

    spark = build_session("txbridge-demo", master=options.master)
    spark.sparkContext.setLogLevel("ERROR")  # spark-avro warns per batch about nullability
    stream = CustomerCounts(
        spark,
        config.bootstrap,
        config.topics["txbridge"],
        Path(config.run_dir) / "stream",
        client=options.client,
    )
    stream.start()
    return stream


def _workload(
    options: DemoOptions,
    config: RunConfig,
    plan: FaultPlan,
    *,
    secret: str,
    running: _Running,
    console: Console,
) -> WorkloadResult:
    """The workload on every path with a progress bar each; the streaming query restarted after a
    third of the txbridge orders."""
    from rich.progress import Progress

    stream = running.stream
    with Progress(console=console, transient=False) as progress:
        bars = {p: progress.add_task(p, total=options.orders) for p in options.paths}
        restart_at = options.orders // 3
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
            coordinator=running.coordinator,
            paths=options.paths,
            quiet_s=_quiet_s(running.setup),
            on_order=on_order,
            client=options.client,
        )
        for restart in restarts:
            restart.join()
    return result


def _quiet_s(setup: RocketMQSetup | None) -> float:
    """How long to keep watching once every order is visible: with RocketMQ, one check interval
    more, so a transaction checked again after its commit shows up as delivered twice."""
    if setup is None:
        return 1.0
    return min(setup.check_interval_s(), 30.0) + 1.0


def _rocketmq_facts(
    setup: RocketMQSetup, target: RocketMQTarget | None, config: RunConfig, result: WorkloadResult
) -> dict[str, Any]:
    from servers.jars import ROCKETMQ_VERSION
    from spark_pipelines.paths.rocketmq_path import summarize
    from spark_pipelines.rocketmq import DEMO_TRANSACTION_SETTINGS, ROCKETMQ_DEFAULTS
    from spark_pipelines.watcher import load_received

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
    options: DemoOptions,
    config: RunConfig,
    plan: FaultPlan,
    result: WorkloadResult,
    *,
    secret: str,
    stream: CustomerCounts | None,
    rocketmq: dict[str, Any] | None,
    console: Console,
) -> Path:
    """The Spark comparison of every path against its database; print the table, write the report."""
    from spark_pipelines.compare import compare
    from spark_pipelines.report import summary_lines, table, write_report
    from spark_pipelines.session import build_session
    from spark_pipelines.watcher import load_visibility

    spark = build_session("txbridge-demo", master=options.master)
    spark.sparkContext.setLogLevel("ERROR")
    truth = {p: config.store(p).committed() for p in options.paths}
    visibility = {key: load_visibility(file) for key, file in result.visibility.items()}
    kafka_topics = config.topics_for([p for p in options.paths if p not in result.received])
    metrics, samples = compare(
        spark,
        config.bootstrap,
        kafka_topics,
        truth,
        visibility=visibility,
        client=options.client,
        received=result.received,
    )
    sinks_skipped = None
    if not options.spark_sink:
        sinks_skipped = "left out with --no-spark-sink"
    elif "txbridge" not in options.paths:
        sinks_skipped = "it writes through the txbridge path's coordinator, left out with --paths"
    info = _run_info(config, plan, result, options.paths, truth, sinks_skipped=sinks_skipped)
    if ("txbridge", "read_committed") in result.visibility:
        info["txbridge_latency"] = _txbridge_latency(config, result, truth["txbridge"], options.client)
    if sinks_skipped is None:
        from spark_pipelines.sink_compare import compare_sinks

        console.print(f"Spark as the producer: {options.spark_sink_rows} rows through each Spark sink ...")
        sink_metrics, sink_samples, info["spark_sink"] = compare_sinks(
            spark, config, secret, rows=options.spark_sink_rows, client=options.client
        )
        metrics += sink_metrics
        samples.update(sink_samples)
    if rocketmq is not None:
        info["rocketmq"] = rocketmq
    if stream is not None:
        stream.catch_up()
        counts = stream.counts()
        per_customer: dict[str, int] = {}
        for order in truth["txbridge"]:
            per_customer[order.customer_id] = per_customer.get(order.customer_id, 0) + 1
        info["streaming_restarts"] = stream.starts - 1
        info["streaming_counts_equal_db"] = counts == per_customer
    console.print(table(metrics))
    for line in summary_lines(metrics, info):
        console.print(line)
    return write_report(Path(config.run_dir), metrics, samples, info)


def _txbridge_latency(
    config: RunConfig, result: WorkloadResult, committed: Sequence[Any], client: ClientConfig
) -> dict[str, Any]:
    """txbridge's commit-to-visible time split at the op record and the republished record
    (:mod:`spark_pipelines.latency_split`)."""
    from spark_pipelines.latency_split import read_decisions, split
    from spark_pipelines.watcher import load_republished
    from txbridge.wire import Topics

    republished = load_republished(result.visibility[("txbridge", "read_committed")])
    decisions = read_decisions(
        config.bootstrap, Topics(config.namespace).op, config.partitions, client.librdkafka()
    )
    return split(committed, republished, decisions)


def _run_info(
    config: RunConfig,
    plan: FaultPlan,
    result: WorkloadResult,
    paths: Sequence[str],
    truth: dict[str, Any],
    *,
    sinks_skipped: str | None,
) -> dict[str, object]:
    """The run's facts for the report: what was planned, what was killed, how it settled, what
    was skipped (``sinks_skipped``: why the Spark sinks' comparison was)."""
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
    skipped = {p: "left out with --paths" for p in ALL_PATHS if p not in paths}
    if sinks_skipped is not None:
        skipped["spark-sink"] = sinks_skipped
    if skipped:
        info["skipped"] = skipped
    if result.coordinator_exits:
        # Exits the plan did not cause (the watchdog's 75, a crash): the run started it again.
        info["coordinator_exits"] = result.coordinator_exits
    if result.coordinator_outages:
        # The restarted coordinator's downtime (SIGKILL -> partitions assigned again; the demo waits
        # 0.1 s before restarting, as a supervisor would) and the txbridge orders committed meanwhile.
        outages = result.coordinator_outages
        committed_ms = [order.committed_ms for order in truth.get("txbridge", [])]
        info["coordinator_downtime_s"] = [round(ready - killed, 2) for killed, ready in outages]
        info["orders_committed_while_coordinator_down"] = sum(
            any(killed * 1000 <= ms <= ready * 1000 for killed, ready in outages) for ms in committed_ms
        )
    return info
