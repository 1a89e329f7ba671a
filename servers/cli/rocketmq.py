"""``txbridge rocketmq start|stop|status``: the local RocketMQ that txbridge is compared with."""

from __future__ import annotations

import sys
import time

import click

from servers import rocketmq as local
from txbridge.settings import one_line_errors


@click.group()
def rocketmq() -> None:
    """The local Apache RocketMQ 5: a name server and a proxy with its broker embedded."""


@rocketmq.command("start")
@click.option(
    "--namesrv-port", default=local.DEFAULT_NAMESRV_PORT, show_default=True, help="Name server port."
)
@click.option(
    "--grpc-port", default=local.DEFAULT_GRPC_PORT, show_default=True, help="Proxy gRPC port (clients)."
)
@click.option(
    "--remoting-port", default=local.DEFAULT_REMOTING_PORT, show_default=True, help="Proxy remoting port."
)
@click.option(
    "--broker-port",
    default=local.DEFAULT_BROKER_PORT,
    show_default=True,
    help="Embedded broker's listenPort (it also takes port-2 and port+1).",
)
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for both processes.")
@one_line_errors
def rocketmq_start(
    namesrv_port: int, grpc_port: int, remoting_port: int, broker_port: int, timeout: float
) -> None:
    """Fetch the jars (once) and start the name server and the proxy in the background."""
    instance = local.LocalRocketMQ(
        namesrv_port=namesrv_port, grpc_port=grpc_port, remoting_port=remoting_port, broker_port=broker_port
    )
    started = time.monotonic()
    status = instance.start(timeout=timeout)
    click.echo(
        f"RocketMQ is up: proxy (gRPC) at {status.endpoint}, name server at {status.namesrv_addr} "
        f"(pids {status.proxy_pid}, {status.namesrv_pid}; {time.monotonic() - started:.1f}s)"
    )
    click.echo(f"logs: {status.log_dir}")


@rocketmq.command("stop")
@one_line_errors
def rocketmq_stop() -> None:
    """Stop the local proxy and name server."""
    if local.LocalRocketMQ.from_home().stop():
        click.echo("stopped")
    else:
        click.echo("no local RocketMQ was running")


@rocketmq.command("status")
@one_line_errors
def rocketmq_status() -> None:
    """Say whether the local name server and proxy run, where, and their memory."""
    status = local.LocalRocketMQ.from_home().status()

    def line(name: str, pid: int | None, address: str, rss: int | None) -> str:
        if pid is None:
            return f"  {name}: not running"
        memory = f", RSS {rss / 2**20:.0f} MiB" if rss else ""
        return f"  {name}: running at {address} (pid {pid}{memory})"

    if status.namesrv_pid is None and status.proxy_pid is None:
        click.echo("local RocketMQ: not running (start it with 'txbridge rocketmq start')")
        sys.exit(1)
    click.echo(f"local RocketMQ: {'running' if status.running else 'PARTLY DOWN'}; logs {status.log_dir}")
    click.echo(line("name server", status.namesrv_pid, status.namesrv_addr, status.namesrv_rss_bytes))
    click.echo(line("proxy", status.proxy_pid, status.endpoint, status.proxy_rss_bytes))
    if not status.running:
        sys.exit(1)
