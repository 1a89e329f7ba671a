"""The current figures, ``docs/results/current.md``: one table made from the newest full run's JSON.

``txbridge bench`` writes every run's figures to ``bench/results/bench-<mode>-<stamp>.json``
(:func:`bench.results.write_json`). This module picks the newest full run there
and renders the figures a reader compares (throughput against the floor and RocketMQ,
latencies and their split, back-checks, memory, failover, scale-out, node kills, the ratios)
with the run's date, commit and machine. The file is generated, so it cannot drift from the JSON:
a unit test renders it again from the newest committed JSON and compares.

    python -m bench.results_table            # rewrite docs/results/current.md
    python -m bench.results_table --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["goal_label", "goal_verdict", "main", "newest_full_run", "render", "table_for"]

#: Where ``txbridge bench`` writes its JSON and where the page goes, from the repository's root.
RESULTS_DIR = Path("bench/results")
CURRENT = Path("docs/results/current.md")


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure's label and the values it joins with `` / ``.

    Each cell is ``(figure name, value key)``, or ``(figure name, min key, max key)`` for a
    range. A row is left out when none of its cells was measured.
    """

    benchmark: str
    figure: str
    cells: tuple[tuple[str, ...], ...]


_HALF = "txbridge commit-to-visible"
_RMQ_RATE = "txbridge commit-to-visible (RocketMQ's rate)"
_AFTER = "kafka txn after decision (RocketMQ's rate)"
_SPLIT = ("p50 ms, decision to op appended", "p50 ms, op to republished", "p50 ms, republished to visible")
_SCALE = ("scale-out, 1 coordinator", "scale-out, 2 coordinators", "scale-out, 4 coordinators")
_ADDREMOVE = ("add + remove coordinator (static membership)", "add + remove coordinator (dynamic membership)")
#: The standby takeovers (the ``failover`` step's figures); the full ``nodekill`` step runs them
#: on its own cluster too, named with ON_CLUSTER after them (CLUSTER_FAILOVERS).
FAILOVERS = ("failover", "failover inside a transaction")
ON_CLUSTER = " on the cluster"
CLUSTER_FAILOVERS = tuple(f"{name}{ON_CLUSTER}" for name in FAILOVERS)


def _on_cluster(figure: str, key: str) -> Row:
    """A row of the cluster's two takeovers (the full ``nodekill`` step's), one ``key`` each."""
    return Row(
        "failover (standby) on the 3-node cluster, at a random moment / inside a transaction",
        figure,
        tuple((name, key) for name in CLUSTER_FAILOVERS),
    )


ROWS: tuple[Row, ...] = (
    Row("raw produce", "msgs/s", (("raw produce", "msgs_per_s"),)),
    Row("raw produce", "broker CPU µs/msg", (("raw produce", "broker_cpu_us_per_msg"),)),
    Row("native txn per message", "msgs/s", (("native txn per message", "msgs_per_s"),)),
    Row(
        "native txn per message",
        "txn p50 / p99 ms",
        (("native txn per message", "txn_p50_ms"), ("native txn per message", "txn_p99_ms")),
    ),
    Row("native txn, 100 per txn", "msgs/s", (("native txn, 100 per txn", "msgs_per_s"),)),
    Row("txbridge end to end", "msgs/s", (("txbridge end to end", "msgs_per_s"),)),
    Row(
        "txbridge end to end",
        "broker / coordinator / producers CPU µs/msg",
        tuple(
            ("txbridge end to end", key)
            for key in ("broker_cpu_us_per_msg", "coordinator_cpu_us_per_msg", "producers_cpu_us_per_msg")
        ),
    ),
    Row("floor end to end", "msgs/s", (("floor end to end", "msgs_per_s"),)),
    Row(
        "floor end to end",
        "broker / republisher / producer + reader CPU µs/msg",
        tuple(
            ("floor end to end", key)
            for key in (
                "broker_cpu_us_per_msg",
                "republisher_cpu_us_per_msg",
                "producer_and_reader_cpu_us_per_msg",
            )
        ),
    ),
    Row(_HALF, "at msgs/s (half load)", ((_HALF, "rate_msgs_per_s"),)),
    Row(_HALF, "p50 / p99 / max ms", tuple((_HALF, k) for k in ("p50_ms", "p99_ms", "max_ms"))),
    Row(
        _HALF,
        "p50 ms: decision to op appended / to republished / to visible",
        tuple((_HALF, k) for k in _SPLIT),
    ),
    Row(
        "floor commit-to-visible",
        "p50 / p99 / max ms (same rate)",
        tuple(("floor commit-to-visible", k) for k in ("p50_ms", "p99_ms", "max_ms")),
    ),
    Row(
        "floor commit-to-visible",
        "p50 ms: decision to op appended / to republished / to visible",
        tuple(("floor commit-to-visible", k) for k in _SPLIT),
    ),
    Row(
        "broker CPU µs/msg at half load",
        "txbridge / floor (same rate)",
        tuple((name, "broker_cpu_us_per_msg") for name in (_HALF, "floor commit-to-visible")),
    ),
    Row(
        "txbridge back-check drain",
        "checks/s / checks",
        (("txbridge back-check drain", "checks_per_s"), ("txbridge back-check drain", "checks")),
    ),
    Row("coordinator memory", "pending transactions", (("coordinator memory", "pending"),)),
    Row(
        "coordinator memory",
        "RSS MB idle / pending (default cache) / pending (16 MiB cache)",
        tuple(
            ("coordinator memory", k) for k in ("rss_idle_mb", "rss_pending_mb", "rss_pending_cache_16mb_mb")
        ),
    ),
    Row(
        "failover (standby), a kill at a random moment",
        "s from the kill to the first republish",
        (("failover", "seconds_to_first_republish"),),
    ),
    Row(
        "failover (standby), a kill at a random moment",
        "max commit-to-visible s on the partitions that stayed",
        (("failover", "survivor_partitions_max_visible_s"),),
    ),
    Row(
        "failover (standby), a kill inside a Kafka transaction",
        "s from the kill to the first republish",
        (("failover inside a transaction", "seconds_to_first_republish"),),
    ),
    Row(
        "failover (standby), a kill inside a Kafka transaction",
        "max commit-to-visible s on the partitions that stayed",
        (("failover inside a transaction", "survivor_partitions_max_visible_s"),),
    ),
    Row(
        "failover and restart",
        "committed but not seen (must be 0)",
        tuple((name, "unseen") for name in (*FAILOVERS, "restart")),
    ),
    _on_cluster("s from the kill to the first republish", "seconds_to_first_republish"),
    _on_cluster(
        "s from the kill to the take-over's start (session, rebalance)", "seconds_to_take_over_start"
    ),
    _on_cluster("s of the take-over (owners read and fenced, claim, restore)", "take_over_s"),
    _on_cluster("committed but not seen (must be 0)", "unseen"),
    Row(
        "restart (same identity)",
        "s from the kill to the first republish",
        (("restart", "seconds_to_first_republish"),),
    ),
    Row(
        "restart under a new name",
        "s from the kill to the first republish / to every partition visible again",
        (
            ("renamed restart", "seconds_to_first_republish"),
            ("renamed restart", "seconds_to_every_partition"),
        ),
    ),
    Row("scale-out 1 / 2 / 4 coordinators", "msgs/s", tuple((name, "msgs_per_s") for name in _SCALE)),
    Row(
        "scale-out 1 / 2 / 4 coordinators",
        "per-instance CPU µs per message it republished",
        tuple((name, "instance_cpu_us_per_msg_min", "instance_cpu_us_per_msg_max") for name in _SCALE),
    ),
    Row(
        "add + remove (static / dynamic membership)",
        "committed / seen exactly once",
        tuple((name, key) for name in _ADDREMOVE for key in ("committed", "seen_once")),
    ),
    Row(
        "add + remove (static / dynamic membership)",
        "SIGTERM: longest pause on one partition s",
        tuple((name, "remove_partition_pause_s") for name in _ADDREMOVE),
    ),
    Row(
        "node kill, 3-node cluster",
        "stall s, txbridge / native",
        (("node kill", "txbridge stall s"), ("node kill", "native stall s")),
    ),
    Row(
        "node kill, 3-node cluster",
        "lost / duplicated, txbridge / native",
        tuple(
            ("node kill", key)
            for key in ("txbridge lost", "txbridge duplicated", "native lost", "native duplicated")
        ),
    ),
    Row("rocketmq txn end to end", "msgs/s", (("rocketmq txn end to end", "msgs_per_s"),)),
    Row("rocketmq plain send", "msgs/s", (("rocketmq plain send", "msgs_per_s"),)),
    Row("rocketmq commit-to-visible", "at msgs/s", (("rocketmq commit-to-visible", "rate_msgs_per_s"),)),
    Row(
        "rocketmq commit-to-visible",
        "p50 / p99 ms",
        (("rocketmq commit-to-visible", "p50_ms"), ("rocketmq commit-to-visible", "p99_ms")),
    ),
    Row(
        "txbridge commit-to-visible at RocketMQ's rate",
        "p50 / p99 ms",
        ((_RMQ_RATE, "p50_ms"), (_RMQ_RATE, "p99_ms")),
    ),
    Row(
        "txbridge commit-to-visible at RocketMQ's rate",
        "p50 ms: decision to op appended / to republished / to visible",
        tuple((_RMQ_RATE, k) for k in _SPLIT),
    ),
    Row(
        "kafka txn after decision at RocketMQ's rate",
        "p50 / p99 ms",
        ((_AFTER, "p50_ms"), (_AFTER, "p99_ms")),
    ),
)


def _number(value: float) -> str:
    """About three significant figures: ``134,730``, ``48.4``, ``2.23``; nothing as ``0``."""
    if value == 0:
        return "0"
    if abs(value) >= 99.95:
        return f"{value:,.0f}"
    if abs(value) >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(values: Mapping[str, Mapping[str, float]], cell: Sequence[str]) -> str | None:
    name, *keys = cell
    found = [values.get(name, {}).get(key) for key in keys]
    if any(v is None for v in found):
        return None
    shown = [_number(v) for v in found if v is not None]
    return shown[0] if len(set(shown)) == 1 else "-".join(shown)


def _when(stamp: str) -> str:
    """A ``YYYYMMDDTHHMMSSZ`` stamp as ``YYYY-MM-DD HH:MM UTC``."""
    if len(stamp) >= 13 and stamp[8] == "T":
        return f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]} UTC"
    return stamp


def _machine(info: Mapping[str, Any]) -> str:
    parts = [
        f"{info.get('cpu_cores', '?')} cores",
        f"{info.get('memory_gib', '?')} GiB",
        f"Python {info.get('python', '?')}",
        f"librdkafka {info.get('librdkafka', '?')}",
        f"Kafka {info.get('kafka', '?')}",
    ]
    if info.get("rocketmq"):
        client = info.get("rocketmq_python_client")
        parts.append(
            f"RocketMQ {info['rocketmq']}" + (f" (rocketmq-python-client {client})" if client else "")
        )
    if info.get("platform"):
        parts.append(str(info["platform"]))
    return ", ".join(parts)


def goal_label(goal: Mapping[str, Any]) -> str:
    """A goal of the JSON as ``name (<= bound)``."""
    bound = "not known" if goal.get("bound") is None else f"{goal['bound']:g}"
    return f"{goal['goal']} ({goal['direction']} {bound})"


def goal_verdict(goal: Mapping[str, Any]) -> str:
    """A goal's value and whether it was met: ``0.400, not met``; ``not measured``."""
    if goal.get("value") is None:
        return "not measured"
    met = {True: "met", False: "not met", None: "bound not known"}[goal.get("met")]
    return f"{goal['value']:.3f}, {met}"


def table_for(run: Mapping[str, Any]) -> list[str]:
    """The table's markdown lines: the :data:`ROWS` measured in ``run``, then every ratio.

    Args:
        run: one run's JSON, as :func:`bench.results.write_json` writes it.
    """
    values = {fig["name"]: fig.get("values", {}) for fig in run.get("figures", [])}
    lines = ["| benchmark | figure | value |", "| --- | --- | ---: |"]
    for row in ROWS:
        cells = [_cell(values, cell) for cell in row.cells]
        if all(c is None for c in cells):
            continue
        lines.append(f"| {row.benchmark} | {row.figure} | {' / '.join(c or 'n/a' for c in cells)} |")
    for label, value in run.get("ratios", {}).items():
        lines.append(f"| ratio | {label} | {value:.3f} |")
    for goal in run.get("goals", []):
        lines.append(f"| goal | {goal_label(goal)} | {goal_verdict(goal)} |")
    return lines


def render(run: Mapping[str, Any], source: str) -> str:
    """``docs/results/current.md`` for ``run``, read from ``source`` (its path from the root).

    Args:
        run: one run's JSON, as :func:`bench.results.write_json` writes it.
        source: where the JSON is, relative to the repository's root (linked from the page).
    """
    commit = run.get("commit") or "not recorded"
    lines = [
        f"<!-- Generated by `python -m bench.results_table` from {source}: do not edit. -->",
        "",
        "# Current benchmark figures",
        "",
        f"The newest full `txbridge bench` run, finished {_when(str(run.get('date', '?')))}, code {commit}.",
        "",
        f"- **Machine:** {_machine(run.get('machine', {}))}.",
        f"- **Every figure of the run:** [{Path(source).name}](../../{source}).",
        "- **What each row measures:** [bench.md](../bench.md); "
        "**how to read them, and the runs before:** [README.md](README.md).",
    ]
    skipped = run.get("skipped") or {}
    if skipped:
        lines.append("- **Skipped:** " + "; ".join(f"{step} ({why})" for step, why in skipped.items()) + ".")
    lines += ["", *table_for(run), ""]
    return "\n".join(lines)


def newest_full_run(results_dir: Path) -> Path:
    """The newest ``bench-full-<stamp>.json`` in ``results_dir`` (stamps sort by time).

    Raises:
        FileNotFoundError: ``results_dir`` holds no full run.
    """
    runs = sorted(results_dir.glob("bench-full-*.json"))
    if not runs:
        raise FileNotFoundError(f"no bench-full-*.json in {results_dir}: run `txbridge bench` first")
    return runs[-1]


def generate(results_dir: Path = RESULTS_DIR, root: Path | None = None) -> str:
    """The page for the newest full run in ``results_dir``; links are relative to ``root``
    (the repository's root, by default the working directory)."""
    root = Path.cwd() if root is None else root
    path = newest_full_run(results_dir)
    try:
        source = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        source = path.as_posix()
    return render(json.loads(path.read_text()), source)


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``docs/results/current.md`` (or, with ``--check``, say whether it is current)."""
    parser = argparse.ArgumentParser(prog="python -m bench.results_table", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the bench JSON is")
    parser.add_argument("--out", type=Path, default=CURRENT, help="the page to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs; write nothing")
    args = parser.parse_args(argv)
    text = generate(args.results)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            sys.stderr.write(f"{args.out} is out of date: run python -m bench.results_table\n")
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    sys.stdout.write(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
