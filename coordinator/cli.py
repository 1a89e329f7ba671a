"""``txbridge coordinator`` / ``python -m coordinator``: run one coordinator instance.

The CLI reads flags, ``TXBRIDGE_*`` env vars and ``--config file.toml``, configures
logging and installs SIGTERM/SIGINT handlers; the library does none of that.

Its Kafka options have the names and env vars of every ``txbridge`` subcommand's, and its
bootstrap servers are resolved as theirs are (:func:`txbridge.settings.resolve_bootstrap`):
run as ``txbridge coordinator``, it falls back on the local broker; run as ``python -m
coordinator``, it needs one.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from typing import Any

import click

from txbridge.settings import BOOTSTRAP_ENV, client_config_flags, one_line_errors, resolve_bootstrap

#: What to pass when no source names the bootstrap servers (``python -m coordinator``).
_SOURCES = (
    f"pass --bootstrap, set {BOOTSTRAP_ENV} or TXBRIDGE_BOOTSTRAP, or name it in --config or --command-config"
)


@click.command("coordinator")
@click.option(
    "--bootstrap",
    envvar=BOOTSTRAP_ENV,
    default=None,
    help=f"Kafka bootstrap servers (env {BOOTSTRAP_ENV}); default: the local broker (txbridge coordinator).",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file with the settings.")
@click.option("--namespace", help="Internal topic prefix (default __txbridge).")
@click.option(
    "--group-id",
    help=(
        "The coordinators' consumer group (default txbridge-coordinator; "
        "txbridge-coordinator.<namespace> for another namespace)."
    ),
)
@click.option(
    "--instance-id",
    help=(
        "This coordinator's client.id and, as a static member, its group.instance.id: unique among "
        "the running coordinators of its group (default: the host name)."
    ),
)
@click.option(
    "--group-protocol",
    type=click.Choice(["classic", "consumer"]),
    help=(
        "The group protocol: classic (default) or consumer (KIP-848, Kafka 4.0+: the broker "
        "assigns partitions incrementally). Every coordinator of a group must use the same."
    ),
)
@click.option("--check-delay", "check_delay_s", type=float, help="Seconds before the first back-check.")
@click.option("--max-checks", type=int, help="Back-checks before a transaction expires.")
@click.option("--check-backoff", "check_backoff_s", type=float, help="First wait after an UNKNOWN check.")
@click.option("--check-backoff-max", "check_backoff_max_s", type=float, help="Cap of the check backoff.")
@click.option(
    "--max-unasked",
    "max_unasked_s",
    type=float,
    help=(
        "Seconds a transaction waits while no check reaches a producer "
        "(no live instance, no secret, URLs refused)."
    ),
)
@click.option(
    "--check-timeout", "check_timeout_s", type=float, help="The longest a back-check request may take, whole."
)
@click.option(
    "--check-concurrency", "check_concurrency_per_group", type=int, help="Check requests in flight per group."
)
@click.option("--check-batch-size", type=int, help="Transactions asked about per check request.")
@click.option("--allowed-check-hosts", help="Comma-separated hosts check URLs may use.")
@click.option("--secret", "secrets", multiple=True, help="GROUP=SECRET (repeatable); prefer env/TOML.")
@click.option("--producer-liveness", "producer_liveness_s", type=float, help="Heartbeat validity, seconds.")
@click.option("--commit-interval-ms", type=int, help="Kafka transaction commit interval.")
@click.option("--transaction-timeout-ms", type=int, help="transaction.timeout.ms of the coordinator.")
@click.option("--payload-cache-bytes", type=int, help="Budget of cached half payloads.")
@click.option("--max-message-bytes", type=int, help="Larger committed messages are quarantined.")
@click.option(
    "--offset-metadata-bytes",
    type=int,
    help="Committed-offset metadata per partition for young transactions (0: changelog only).",
)
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on this port.")
@click.option("--log-interval", "log_interval_s", type=float, help="Seconds between INFO count lines.")
@click.option(
    "--check-invariants",
    is_flag=True,
    default=None,
    help="Assert the state's invariants after every step (debugging; a pass over the pending set each time).",
)
@click.option(
    "--tracing",
    is_flag=True,
    default=None,
    help="OpenTelemetry spans of back-checks and republishes, exported as the OTEL_* variables say.",
)
@client_config_flags(x_aliases=("--kafka-config",))
@one_line_errors
def coordinator(
    bootstrap: str | None,
    config_path: str | None,
    secrets: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run a txbridge coordinator until SIGTERM/SIGINT.

    Its Kafka client settings: --command-config FILE (or the TOML's client_config and [kafka]
    table) with -X KEY=VALUE on top; the start-up probe connects with them.
    """
    # First, before the imports below: a supervisor's SIGUSR1 before this would end the process.
    _dump_stacks_on_sigusr1()
    from coordinator.commit.tracing import install_provider
    from coordinator.config import CoordinatorConfig, parse_pairs
    from coordinator.service import Coordinator

    logging.getLogger("coordinator").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags["bootstrap"] = bootstrap or None
    if secrets:
        flags["secrets"] = parse_pairs(secrets, "--secret")
    # The one read of each source: flags, TXBRIDGE_* variables, the TOML file (docs/coordinator.md).
    config = CoordinatorConfig.load(flags=flags, env=os.environ, toml_path=config_path)
    provider = install_provider(os.environ) if config.tracing else None
    # Then what names the Kafka when none of them does: the client file, else the local broker.
    bootstrap = resolve_bootstrap(config.bootstrap or None, client=config.client_config, sources=_SOURCES)
    config = config.replace(bootstrap=bootstrap)
    service = Coordinator(config, on_wedged=_end_wedged_process)

    def on_signal(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: stopping", signum)
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.run()
    finally:
        if provider is not None:
            provider.shutdown()  # exports the spans still batched
    sys.exit(0)


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to stderr: where a stalled coordinator waits."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, OSError, ValueError):
        # A stderr without a file descriptor (the command run in-process, as click's CliRunner
        # does): there is nowhere to write stacks to, and no supervisor to ask for them.
        logging.getLogger(__name__).debug("no file descriptor for stacks on SIGUSR1")


def _end_wedged_process(wedged: Any) -> None:
    """A Kafka call outlived its timeout (coordinator/monitoring/watchdog.py): end the process, so that a
    supervisor starts it again (compose: restart: unless-stopped). It cannot be interrupted."""
    from coordinator.monitoring.watchdog import EXIT_WEDGED

    for handler in logging.getLogger().handlers:
        handler.flush()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(EXIT_WEDGED)
