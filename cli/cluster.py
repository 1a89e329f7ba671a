"""``txbridge init`` and ``txbridge smoke``: ready a cluster for txbridge, and check it answers."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import click

from txbridge.errors import TxBridgeError
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

__all__ = ["init", "smoke"]


@click.command()
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


@click.command()
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
