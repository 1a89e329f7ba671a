"""The benchmark's table and JSON, with the machine they came from."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.kafka_native import Figure
from bench.results_table import CLUSTER_FAILOVERS, FAILOVERS, goal_label, goal_verdict


def machine() -> dict[str, Any]:
    import psutil

    from servers import jars
    from txbridge import kafka

    return {
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        **kafka.versions(),  # librdkafka's and confluent_kafka's
        "kafka": jars.kafka_version(),
        "rocketmq": jars.ROCKETMQ_VERSION,
        "rocketmq_python_client": _version("rocketmq-python-client"),
    }


def commit() -> str | None:
    """The checkout's short commit, with ``-dirty`` when tracked files differ from it; None
    outside a git checkout (an installed wheel)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]  # bench/results.py
    if not (root / ".git").exists():  # not a checkout of txbridge, whatever repository holds it
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"],
            capture_output=True,
            check=False,  # 1: the work tree differs from HEAD
            timeout=10,
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty == 1 else head


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def ratios(figures: Sequence[Figure]) -> dict[str, float]:
    by_name = {f.name: f for f in figures}
    out: dict[str, float] = {}
    for top, base, label in (
        ("txbridge end to end", "raw produce", "txbridge / raw produce"),
        ("txbridge end to end", "native txn per message", "txbridge / native txn per message"),
        ("floor end to end", "raw produce", "floor / raw produce"),
        ("txbridge end to end", "floor end to end", "txbridge / floor"),
        ("txbridge end to end", "rocketmq txn end to end", "txbridge / rocketmq txn"),
        ("rocketmq txn end to end", "rocketmq plain send", "rocketmq txn / rocketmq plain send"),
    ):
        if top in by_name and base in by_name and by_name[base].msgs_per_s > 0:
            out[label] = by_name[top].msgs_per_s / by_name[base].msgs_per_s
    # What a message costs the broker through txbridge against the same Kafka I/O without it:
    # saturated (each at its own rate), and at the one rate both latency steps run at. A produce
    # request carries one partition's batch (librdkafka), and a batch gathers what arrives within
    # linger.ms, so the broker's requests per message fall as the rate rises: the saturated ratio
    # also charges txbridge for its lower rate; the half-load one does not.
    for top, base, label in (
        ("txbridge end to end", "floor end to end", "txbridge / floor broker CPU per message"),
        (
            "txbridge commit-to-visible",
            "floor commit-to-visible",
            "txbridge / floor broker CPU per message, same rate",
        ),
    ):
        top_cpu, base_cpu = (
            by_name[n].values.get("broker_cpu_us_per_msg") if n in by_name else None for n in (top, base)
        )
        if top_cpu is not None and base_cpu:
            out[label] = top_cpu / base_cpu
    # Latency: how far txbridge's commit-to-visible p50 is above the floor's, at the same rate.
    txbridge, floor = by_name.get("txbridge commit-to-visible"), by_name.get("floor commit-to-visible")
    if txbridge is not None and floor is not None and floor.values.get("p50_ms", 0.0) > 0:
        out["txbridge / floor latency p50"] = txbridge.values["p50_ms"] / floor.values["p50_ms"]
    # Against RocketMQ at its commit-to-visible rate (the rocketmq step times txbridge at it too):
    # the goals are txbridge's p50 and p99 at most RocketMQ's, so ratios at most 1.
    txbridge = by_name.get("txbridge commit-to-visible (RocketMQ's rate)")
    rmq = by_name.get("rocketmq commit-to-visible")
    if txbridge is not None and rmq is not None:
        for percentile in ("p50", "p99"):
            if rmq.values.get(f"{percentile}_ms", 0.0) > 0:
                out[f"txbridge / rocketmq commit-to-visible {percentile}"] = (
                    txbridge.values[f"{percentile}_ms"] / rmq.values[f"{percentile}_ms"]
                )
    # What stands between them: a Kafka transaction begun after the decision, at the same rate.
    kafka_txn = by_name.get("kafka txn after decision (RocketMQ's rate)")
    if kafka_txn is not None and kafka_txn.values.get("p50_ms", 0.0) > 0:
        if rmq is not None and rmq.values.get("p50_ms", 0.0) > 0:
            out["kafka txn after decision / rocketmq commit-to-visible p50"] = (
                kafka_txn.values["p50_ms"] / rmq.values["p50_ms"]
            )
        if txbridge is not None:
            out["txbridge / kafka txn after decision p50"] = (
                txbridge.values["p50_ms"] / kafka_txn.values["p50_ms"]
            )
    return out


@dataclass(frozen=True)
class Goal:
    """One of the goals the bench's figures are held to (issue 41): a figure, its bound, the
    direction (``at_least``: the figure must reach the bound; else stay at or under it)."""

    name: str
    at_least: bool
    bound: float | None
    value: float | None

    @property
    def met(self) -> bool | None:
        """None when the run did not measure it (or its bound)."""
        if self.value is None or self.bound is None:
            return None
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def as_json(self) -> dict[str, Any]:
        return {
            "goal": self.name,
            "bound": None if self.bound is None else round(self.bound, 3),
            "direction": ">=" if self.at_least else "<=",
            "value": None if self.value is None else round(self.value, 3),
            "met": self.met,
        }


#: How far past the transaction timeout a coordinator restarted under a new name may take
#: to have its partitions visible again.
RENAMED_MARGIN_S = 5.0


def goals(figures: Sequence[Figure]) -> list[Goal]:
    """The goals, each with what this run measured (None: the step did not run)."""
    by_name = {f.name: f for f in figures}
    ratio = ratios(figures)

    def value(name: str, key: str) -> float | None:
        figure = by_name.get(name)
        return None if figure is None else figure.values.get(key)

    # Both standby takeovers, the kill at a random moment and the one inside a transaction: the
    # worse, held to the bound of where they ran (one broker, or a cluster: its longer session).
    takeovers: dict[bool, list[float]] = {False: [], True: []}
    for name in (*FAILOVERS, *CLUSTER_FAILOVERS):
        figure = by_name.get(name)
        seconds = None if figure is None else figure.values.get("seconds_to_first_republish")
        if figure is not None and seconds is not None:
            brokers = figure.params.get("brokers", 1)
            takeovers[isinstance(brokers, int) and brokers > 1].append(seconds)
    renamed = by_name.get("renamed restart")
    timeout_s = None if renamed is None else renamed.params.get("transaction_timeout_s")
    renamed_bound = float(timeout_s) + RENAMED_MARGIN_S if isinstance(timeout_s, int | float) else None
    return [
        Goal("txbridge / floor throughput", True, 0.8, ratio.get("txbridge / floor")),
        Goal(
            "half-load commit-to-visible p50, txbridge / floor",
            False,
            1.2,
            ratio.get("txbridge / floor latency p50"),
        ),
        Goal(
            "broker CPU per message, txbridge / floor",
            False,
            1.3,
            ratio.get("txbridge / floor broker CPU per message"),
        ),
        Goal(
            "restart in place: s to the first republish",
            False,
            1.0,
            value("restart", "seconds_to_first_republish"),
        ),
        Goal(
            "standby takeover, one broker: s to the first republish",
            False,
            7.0,
            max(takeovers[False], default=None),
        ),
        Goal(
            "standby takeover, cluster: s to the first republish",
            False,
            13.0,
            max(takeovers[True], default=None),
        ),
        Goal(
            "renamed restart: s until every partition is visible again (transaction timeout + 5 s)",
            False,
            renamed_bound,
            value("renamed restart", "seconds_to_every_partition"),
        ),
    ]


def write_json(
    figures: Sequence[Figure],
    out_dir: Path,
    *,
    mode: str,
    bootstrap: str,
    skipped: Mapping[str, str] | None = None,
    some_steps: bool = False,
) -> Path:
    """The run's JSON, ``bench-<mode>-<stamp>.json``; ``bench-steps-<mode>-<stamp>.json`` when
    ``some_steps`` (``--only``/``--skip``), which :mod:`bench.results_table` never takes for a
    whole run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"bench-{'steps-' if some_steps else ''}{mode}-{stamp}.json"
    data = {
        "date": stamp,
        "mode": mode,
        "commit": commit(),
        "bootstrap": bootstrap,
        "machine": machine(),
        "figures": [
            {
                "name": f.name,
                "messages": f.messages,
                "seconds": round(f.seconds, 3),
                "values": {k: round(v, 3) for k, v in f.values.items()},
                "params": f.params,
            }
            for f in figures
        ],
        "ratios": {k: round(v, 3) for k, v in ratios(figures).items()},
        "goals": [g.as_json() for g in goals(figures)],
        "skipped": dict(skipped or {}),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


_UNITS = {
    "msgs_per_s": "msgs/s",
    "mb_per_s": "MB/s",
    "txn_per_s": "txn/s",
    "txn_p50_ms": "txn p50 ms",
    "txn_p99_ms": "txn p99 ms",
    "broker_cpu_us_per_msg": "broker CPU µs/msg",
    "coordinator_cpu_us_per_msg": "coordinator CPU µs/msg",
    "producers_cpu_us_per_msg": "producers' CPU µs/msg",
    "producer_cpu_us_per_msg": "producer CPU µs/msg",
    "reader_cpu_us_per_msg": "reader CPU µs/msg",
    "republisher_cpu_us_per_msg": "republisher CPU µs/msg",
    "producer_and_reader_cpu_us_per_msg": "producer + reader CPU µs/msg",
    "seconds_to_first_republish": "s from the kill to the first republish",
    "seconds_to_every_partition": "s from the kill to every partition visible again",
    "partitions_back": "partitions visible again",
    "survivor_partitions_max_visible_s": "max commit-to-visible s on the partitions that stayed",
    "unseen": "committed but not seen (must be 0)",
    "restart_first_log_s": "restart: s to the new process's first log line",
    "restart_claimed_s": "restart: s to its transactional id made",
    "restart_fenced_s": "restart: s to the earlier incarnation fenced",
    "restart_assigned_s": "restart: s to its partitions restored and assigned",
    "instance_cpu_us_per_msg_min": "per-instance CPU µs per message it republished, min",
    "instance_cpu_us_per_msg_max": "per-instance CPU µs per message it republished, max",
    "instance_idle_cpu_ms_per_s": "per-instance idle CPU ms/s",
    "partitions_per_instance_min": "half partitions per instance, min",
    "partitions_per_instance_max": "half partitions per instance, max",
    "latency_rate_msgs_per_s": "commit-to-visible at msgs/s",
    "load_msgs_per_s": "steady load msgs/s",
    "seen_once": "committed, seen exactly once",
    "steady_partition_pause_s": "steady: longest gap on one partition s",
    "add_partition_pause_s": "add: longest pause on one partition s",
    "add_topic_pause_s": "add: longest pause, whole topic s",
    "add_max_visible_s": "add: max commit-to-visible s",
    "remove_partition_pause_s": "SIGTERM: longest pause on one partition s",
    "remove_topic_pause_s": "SIGTERM: longest pause, whole topic s",
    "remove_max_visible_s": "SIGTERM: max commit-to-visible s",
    "client_cpu_us_per_msg": "client CPU µs/msg",
    "call_p50_ms": "call p50 ms",
    "call_p99_ms": "call p99 ms",
}


def render(figures: Sequence[Figure]) -> Any:
    """A rich Table of every figure, then the ratios."""
    from rich.table import Table

    table = Table(title="txbridge benchmark", show_lines=False)
    table.add_column("benchmark")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for fig in figures:
        first = True
        for key, value in fig.values.items():
            table.add_row(fig.name if first else "", _UNITS.get(key, key), f"{value:,.2f}")
            first = False
    for label, value in ratios(figures).items():
        table.add_row("ratio", label, f"{value:.3f}")
    for goal in goals(figures):
        if goal.value is not None:
            table.add_row("goal", goal_label(goal.as_json()), goal_verdict(goal.as_json()))
    return table


def markdown(figures: Sequence[Figure], info: dict[str, Any]) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} on {info['cpu_cores']} cores, "
        f"{info['memory_gib']} GiB, Python {info['python']}, librdkafka {info['librdkafka']}, "
        f"Kafka {info['kafka']} (single local broker"
        + ("; node kill: a secured 3-node cluster" if any(f.name == "node kill" for f in figures) else "")
        + ")"
        + (
            f", RocketMQ {info['rocketmq']} (one broker embedded in its proxy, "
            f"rocketmq-python-client {info['rocketmq_python_client']})."
            if any(f.name.startswith("rocketmq") for f in figures)
            else "."
        ),
        "",
        "| benchmark | figure | value |",
        "| --- | --- | ---: |",
    ]
    for fig in figures:
        for key, value in fig.values.items():
            lines.append(f"| {fig.name} | {_UNITS.get(key, key)} | {value:,.2f} |")
    for label, value in ratios(figures).items():
        lines.append(f"| ratio | {label} | {value:.3f} |")
    for goal in goals(figures):
        if goal.value is not None:
            lines.append(f"| goal | {goal_label(goal.as_json())} | {goal_verdict(goal.as_json())} |")
    return "\n".join(lines) + "\n"
