"""The ``txbridge`` command: one CLI for the whole project, assembled from its layers.

Each layer declares its own subcommands beside its code: the coordinator's in
:mod:`coordinator.cli` (which ``python -m coordinator`` runs too), the console's in
:mod:`console.cli`, the local servers' in :mod:`servers.cli`, the demo's in
:mod:`spark_pipelines.cli`, the bench's in :mod:`bench.cli`; the SDK's (``init``, ``smoke``,
``consume``, ``admin``, ``acls``) are modules of this package. This module adds them all,
owns the global options and is the only place that configures logging. Those modules import
their heavy packages (pyspark, matplotlib, rich, psutil, the coordinator's) inside the
command, so ``txbridge --help`` stays fast and the base install lists every command.

The options every command shares, and the resolution of the bootstrap servers from their
sources, are :mod:`txbridge.settings`; this group gives it its last source, the local broker.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any

import click

from cli import acls, admin, cluster, consume
from coordinator.cli import coordinator
from servers.cli import kafka, local_bootstrap, rocketmq, setup, spark
from txbridge.settings import LocalBrokerFallback


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
    # Every subcommand, `txbridge coordinator` too, falls back on the local broker when no source
    # names the bootstrap servers (txbridge.settings.bootstrap); `python -m coordinator` does not.
    ctx.obj = LocalBrokerFallback(local_broker=local_bootstrap)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # librdkafka warns about transient broker states (coordinator loading,
        # reconnects) that it retries by itself; show them with -v.
        logging.getLogger("txbridge.librdkafka").setLevel(logging.ERROR)


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
_OUR_PACKAGES = frozenset(
    {"txbridge", "coordinator", "console", "servers", "spark_pipelines", "bench", "cli"}
)
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


# --------------------------------------------------------------------------- the subcommands


def _bench() -> tuple[click.Command, ...]:
    from bench.cli import bench

    return (bench,)


def _console() -> tuple[click.Command, ...]:
    from console.cli import console

    return (console,)


def _pipelines() -> tuple[click.Command, ...]:
    from spark_pipelines.cli import demo, report

    return demo, report


def _layer(
    package: str, names: tuple[str, ...], load: Callable[[], tuple[click.Command, ...]]
) -> tuple[click.Command, ...]:
    """The commands of a layer that an install may leave out (the coordinator's image copies no
    bench, console or pipelines): stand-ins saying what to install when its package is absent."""
    try:
        return load()
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise
        return tuple(
            _needs_extra(name, _install_hint(name, _EXTRAS.get(name, "all"), [package])) for name in names
        )


# The subcommands, each declared by its layer.
for _command in (
    kafka,
    setup,
    cluster.init,
    cluster.smoke,
    coordinator,
    admin.admin,
    acls.acls,
    consume.consume,
    rocketmq,
    spark,
    *_layer("bench", ("bench",), _bench),
    *_layer("console", ("console",), _console),
    *_layer("spark_pipelines", ("demo", "report"), _pipelines),
):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
