"""The ``txbridge`` command: one CLI for the whole project.

The main group and its own commands (``kafka``, ``setup``, ``init``, ``smoke``); every other
subcommand is a module of this package (the coordinator's is :mod:`coordinator.cli`, which
``python -m coordinator`` runs too), added below with :meth:`click.Group.add_command`. Those
modules import their heavy packages (pyspark, matplotlib, rich, psutil, the coordinator's)
inside the command, so ``txbridge --help`` stays fast and the base install lists every command.

The CLI is the only place that configures logging and reads the environment.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import click

from coordinator.cli import BOOTSTRAP_RESOLVER, coordinator
from txbridge.errors import TxBridgeError
from txbridge.tools.cli import acls, admin, bench, consume, demo, rocketmq, spark
from txbridge.tools.cli import console as console_cli
from txbridge.tools.cli.options import (
    bootstrap_option,
    client_options,
    one_line_errors,
    resolve_bootstrap,
)

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig


class _Commands(click.Group):
    """The CLI's group. A subcommand whose extra (:data:`_EXTRAS`) is not installed is listed
    with what to install, and running it is a one-line error saying so."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        extra = _EXTRAS.get(cmd_name)
        if command is None or extra is None or cmd_name in _PARTLY:
            return command
        missing = _not_installed(extra)
        return _needs_extra(cmd_name, _install_hint(cmd_name, extra, missing)) if missing else command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        extra = _EXTRAS.get(name or "")
        missing = _not_installed(extra) if extra and name not in _PARTLY else []
        if missing:
            click.echo(f"error: {_install_hint(name or '', extra or '', missing)}", err=True)
            sys.exit(2)
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:  # a package of an extra, reached by a command that runs without
            top = (exc.name or "").partition(".")[0]
            if not top or top in _OUR_PACKAGES:
                raise
            name = ctx.invoked_subcommand or ""
            click.echo(f"error: {_install_hint(name, _EXTRAS.get(name, 'all'), [top])}", err=True)
            sys.exit(2)


@click.group(cls=_Commands)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """txbridge: RocketMQ-style transactional messages on an existing Kafka."""
    # `txbridge coordinator` finds the local broker when no bootstrap is given, as every command does.
    ctx.meta[BOOTSTRAP_RESOLVER] = resolve_bootstrap
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # librdkafka warns about transient broker states (coordinator loading,
        # reconnects) that it retries by itself; show them with -v.
        logging.getLogger("txbridge.librdkafka").setLevel(logging.ERROR)


# --------------------------------------------------------------------------- kafka


@main.group()
def kafka() -> None:
    """The local Kafka: a single plaintext node (the embedded default) or a secured 3-node cluster."""


@kafka.command("start")
@click.option("--port", default=9092, show_default=True, help="Client listener port (single node).")
@click.option(
    "--controller-port", default=9093, show_default=True, help="KRaft controller port (single node)."
)
@click.option(
    "--timeout",
    default=90.0,
    show_default=True,
    help="Give up after this many seconds without an answer and without a new line in the broker's "
    "log (recovering a large data directory may take minutes: it logs as it goes).",
)
@click.option(
    "--brokers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Nodes: 1 for the plaintext broker, 3 or more for the secured cluster (with --secure).",
)
@click.option("--secure", is_flag=True, help="SASL_SSL with SCRAM-SHA-512, TLS and ACLs (needs --brokers 3).")
@one_line_errors
def kafka_start(port: int, controller_port: int, timeout: float, brokers: int, secure: bool) -> None:
    """Fetch the jars (once), format (once) and start the broker in the background."""
    from txbridge.tools.local.broker import LocalKafka

    if secure or brokers > 1:
        _start_cluster(brokers, secure, timeout)
        return
    broker = LocalKafka(port=port, controller_port=controller_port)
    started = time.monotonic()
    status = broker.start(timeout=timeout)
    click.echo(f"Kafka is up at {status.bootstrap} (pid {status.pid}, {time.monotonic() - started:.1f}s)")
    click.echo(f"log: {status.log_file}")


def _start_cluster(brokers: int, secure: bool, timeout: float) -> None:
    from txbridge.errors import ConfigurationError
    from txbridge.tools.local.cluster import LocalCluster

    if not secure or brokers < 3:
        raise ConfigurationError(
            "the local cluster is secured and has 3 or more nodes: pass --brokers 3 --secure "
            "(or neither, for the single plaintext broker)"
        )
    cluster = LocalCluster(nodes=brokers)
    started = time.monotonic()
    status = cluster.start(timeout=timeout)
    click.echo(
        f"secured Kafka cluster is up at {status.bootstrap} "
        f"({len(status.nodes)} nodes, {time.monotonic() - started:.1f}s)"
    )
    click.echo(f"admin client properties (SASL_SSL, SCRAM-SHA-512): {status.properties_file}")
    click.echo(f"CA certificate: {cluster.ca_file}; logs: {cluster.home}/node-<id>/logs/server.log")


@kafka.command("stop")
@one_line_errors
def kafka_stop() -> None:
    """Stop the local broker and the local cluster, whichever runs."""
    from txbridge.tools.local.broker import LocalKafka
    from txbridge.tools.local.cluster import LocalCluster

    broker_stopped = LocalKafka.from_home().stop()
    cluster_stopped = LocalCluster.from_home().stop()
    if broker_stopped:
        click.echo("stopped")
    if cluster_stopped:
        click.echo("stopped the local cluster")
    if not (broker_stopped or cluster_stopped):
        click.echo("no local broker was running")


@kafka.command("status")
@bootstrap_option
@client_options
@one_line_errors
def kafka_status(bootstrap: str | None, client: ClientConfig) -> None:
    """Say whether the local broker and cluster (or the broker at --bootstrap) answer."""
    from txbridge.kafka import check_reachable
    from txbridge.tools.local.broker import LocalKafka
    from txbridge.tools.local.cluster import LocalCluster

    bootstrap = bootstrap or client.bootstrap
    if bootstrap:
        check_reachable(bootstrap, extra=client.librdkafka())
        click.echo(f"a broker answers at {bootstrap}")
        return
    cluster = LocalCluster.from_home().status()
    cluster_up = bool(cluster.up)
    if cluster_up:
        up = len(cluster.up)
        click.echo(f"local cluster: {up} of {len(cluster.nodes)} nodes up at {cluster.bootstrap}")
        click.echo(f"  admin client properties: {cluster.properties_file}")
        for node in cluster.nodes:
            if node.running:
                rss = f", RSS {node.rss_bytes / 2**20:.0f} MiB" if node.rss_bytes else ""
                click.echo(f"  node {node.node_id}: up at {node.address} (pid {node.pid}{rss})")
            else:
                click.echo(f"  node {node.node_id}: DOWN; log {node.log_file}")
    status = LocalKafka.from_home().status()
    if not status.running:
        if not cluster_up:
            click.echo("local broker: not running (start it with 'txbridge kafka start')")
            sys.exit(1)
        return
    check_reachable(status.bootstrap)
    click.echo(f"local broker: running at {status.bootstrap} (pid {status.pid}); log {status.log_file}")


@main.command()
@click.option("--spark/--no-spark", default=True, help="Also fetch Spark's Kafka source jars.")
@click.option("--rocketmq/--no-rocketmq", default=True, help="Also fetch Apache RocketMQ's jars (91 MB).")
@one_line_errors
def setup(spark: bool, rocketmq: bool) -> None:
    """Check Java and Maven and fetch every jar txbridge runs locally (once)."""
    from txbridge.tools.local import jars

    jars.check_prerequisites()
    sets = [jars.kafka_broker()]  # of TXBRIDGE_KAFKA_VERSION, if set
    if spark and importlib.util.find_spec("pyspark") is None:
        click.echo("spark-kafka: skipped, no pyspark installed (its jars follow pyspark's version)")
    elif spark:
        sets.append(jars.spark_kafka())
    sets += [jars.ROCKETMQ] if rocketmq else []
    for jar_set in sets:
        started = time.monotonic()
        folder = jars.ensure_jars(jar_set)
        count = len(list(folder.glob("*.jar")))
        click.echo(f"{jar_set.name}: {count} jars in {folder} ({time.monotonic() - started:.1f}s)")


@main.command()
@bootstrap_option
@client_options
@click.option("--namespace", default="__txbridge", show_default=True, help="Internal topic prefix.")
@click.option("--partitions", default=12, show_default=True, help="Partitions of half, op and state.")
@click.option("--replication-factor", default=-1, help="Replicas per topic (default: the broker's).")
@one_line_errors
def init(
    bootstrap: str | None, client: ClientConfig, namespace: str, partitions: int, replication_factor: int
) -> None:
    """Create txbridge's internal topics (idempotent) and say what was done."""
    from txbridge.topics import init_topics

    bootstrap = resolve_bootstrap(bootstrap, client=client)
    outcomes = init_topics(bootstrap, namespace, partitions, replication_factor, client_config=client)
    for topic, outcome in outcomes.items():
        click.echo(f"{outcome:8} {topic}")


@main.command()
@bootstrap_option
@client_options
@one_line_errors
def smoke(bootstrap: str | None, client: ClientConfig) -> None:
    """Send one message and read it back (starts the local broker if needed)."""
    from txbridge import kafka

    bootstrap = resolve_bootstrap(bootstrap, start_local=True, client=client)
    settings = client.librdkafka()
    topic = f"txbridge-smoke-{uuid.uuid4().hex[:8]}"
    kafka.ensure_topics(bootstrap, [kafka.TopicSpec(topic)], extra=settings)
    producer = kafka.producer(bootstrap, settings)
    producer.produce(topic, key=b"k", value=b"hello from txbridge")
    if producer.flush(30) != 0:
        raise TxBridgeError(f"the smoke message was not acknowledged by {bootstrap}")
    consumer = kafka.consumer(bootstrap, f"smoke-{uuid.uuid4().hex[:8]}", settings)
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                click.echo(f"smoke ok: read {msg.value()!r} from {topic} at {bootstrap}")
                return
    finally:
        consumer.close()
    raise TxBridgeError(f"the smoke message did not come back from {topic} within 30s")


# Subcommands that live in modules of their own.
for _command in (
    coordinator,
    admin.admin,
    console_cli.console,
    acls.acls,
    consume.consume,
    demo.demo,
    demo.report,
    bench.bench,
    rocketmq.rocketmq,
    spark.spark,
):
    main.add_command(_command)


# --------------------------------------------------------------------------- extras

#: The extra (pyproject.toml) each subcommand needs beyond the base install; checked before it
#: runs, except for those in :data:`_PARTLY`.
_EXTRAS = {
    "coordinator": "coordinator",
    "demo": "spark",
    "report": "spark",
    "bench": "bench",
    "kafka": "local",
    "console": "console",
    "spark": "spark",
}
#: Subcommands that need their extra for part of what they do: ``kafka`` for the secured cluster
#: and the local processes' status, not to ask a broker at --bootstrap (the image's
#: wait-for-kafka). A missing package is named when the command reaches it.
_PARTLY = frozenset({"kafka"})
_OUR_PACKAGES = frozenset({"txbridge", "coordinator", "spark_pipelines", "console"})
#: A requirement's name and extras, as in ``txbridge[coordinator]; extra == "spark"``.
_REQUIREMENT = re.compile(r"\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?")


def _install_hint(command: str, extra: str, missing: list[str]) -> str:
    return (
        f"'txbridge {command}' needs {', '.join(missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'txbridge[{extra}]'"
    )


def _not_installed(extra: str) -> list[str]:
    """The distributions of txbridge's ``extra`` (and of the extras it names) not installed.

    Read from txbridge's installed metadata, so pyproject.toml stays the one list; empty when
    txbridge itself is not installed (run from a source tree).
    """
    from importlib import metadata

    try:
        requirements = metadata.requires("txbridge") or []
    except metadata.PackageNotFoundError:
        return []
    missing: list[str] = []
    wanted, seen = [extra], set()
    while wanted:
        current = wanted.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in requirements:
            spec, _, marker = requirement.partition(";")
            if f'extra == "{current}"' not in marker.replace("'", '"'):
                continue
            found = _REQUIREMENT.match(spec)
            if found is None:
                continue
            name, extras = found.group("name"), found.group("extras") or ""
            if name.lower() == "txbridge":
                wanted.extend(e.strip() for e in extras.split(",") if e.strip())
                continue
            try:
                metadata.distribution(name)
            except metadata.PackageNotFoundError:
                if name not in missing:
                    missing.append(name)
    return missing


def _needs_extra(name: str, message: str) -> click.Command:
    """A stand-in for subcommand ``name`` whose module cannot be imported: says what to install."""

    def fail() -> None:
        click.echo(f"error: {message}", err=True)
        sys.exit(2)

    return click.Command(
        name,
        callback=fail,
        help=f"(not installed) {message}",
        short_help=f"(not installed: pip install 'txbridge[{_EXTRAS.get(name, 'all')}]')",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


if __name__ == "__main__":  # pragma: no cover
    main()
