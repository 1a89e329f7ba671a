"""``txbridge kafka start|stop|status`` and ``txbridge setup``: the local Kafka and the jars.

:func:`local_bootstrap` is the ``txbridge`` command's last source of the bootstrap servers
(:mod:`txbridge.settings.bootstrap`): the local broker, started on demand.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import TYPE_CHECKING

import click

from txbridge.settings import bootstrap_option, client_options, one_line_errors

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

__all__ = ["kafka", "local_bootstrap", "setup"]


def local_bootstrap(*, start: bool) -> str:
    """The local broker's bootstrap servers; started first if ``start`` and it does not run.

    Raises:
        TxBridgeError: it does not run and ``start`` is false.
    """
    from servers.broker import LocalKafka
    from txbridge.errors import TxBridgeError

    broker = LocalKafka.from_home()
    status = broker.status()
    if not status.running:
        if not start:
            raise TxBridgeError(
                "no --bootstrap given and the local broker is not running: "
                "start it with 'txbridge kafka start' or pass --bootstrap"
            )
        click.echo(f"starting the local Kafka broker at {broker.bootstrap} ...", err=True)
        status = broker.start()
    return status.bootstrap


@click.group()
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
    from servers.broker import LocalKafka

    if secure or brokers > 1:
        _start_cluster(brokers, secure, timeout)
        return
    broker = LocalKafka(port=port, controller_port=controller_port)
    started = time.monotonic()
    status = broker.start(timeout=timeout)
    click.echo(f"Kafka is up at {status.bootstrap} (pid {status.pid}, {time.monotonic() - started:.1f}s)")
    click.echo(f"log: {status.log_file}")


def _start_cluster(brokers: int, secure: bool, timeout: float) -> None:
    from servers.cluster import LocalCluster
    from txbridge.errors import ConfigurationError

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
    from servers.broker import LocalKafka
    from servers.cluster import LocalCluster

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
    from servers.broker import LocalKafka
    from servers.cluster import LocalCluster
    from txbridge.kafka import check_reachable

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


@click.command()
@click.option("--spark/--no-spark", default=True, help="Also fetch Spark's Kafka source jars.")
@click.option("--rocketmq/--no-rocketmq", default=True, help="Also fetch Apache RocketMQ's jars (91 MB).")
@one_line_errors
def setup(spark: bool, rocketmq: bool) -> None:
    """Check Java and Maven and fetch every jar txbridge runs locally (once)."""
    from servers import jars

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
