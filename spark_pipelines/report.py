"""The report of a run: a rich table in the terminal, Markdown with PNG charts on disk.

Everything is written under ``reports/<run-id>/``: ``metrics.json`` (the
numbers, also what ``txbridge report`` re-renders), ``report.md``,
``counts.png`` and ``latency.png``. The run's facts (``info``) may hold
``rocketmq`` (its broker settings and what the checks did, a section of its own),
``spark_sink`` (the fifth comparison, Spark as the producer: its facts, a section of its own)
and ``skipped`` (paths left out with ``--paths``, the Spark sinks' comparison when left out;
said at the top).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from spark_pipelines.compare import PathMetrics

COUNT_COLUMNS = ("committed", "delivered", "lost", "phantom", "duplicates", "order_violations", "undecodable")
#: Path names in the title and one colour per path in every chart.
PATH_TITLES = {
    "txbridge": "txbridge",
    "native": "Kafka transactions",
    "plain": "plain produce",
    "rocketmq": "RocketMQ",
    "spark-sink/kafka": "Spark's Kafka sink",
    "spark-sink/txbridge": "Spark's txbridge sink",
}
PATH_COLOURS = {
    "txbridge": "tab:blue",
    "native": "tab:orange",
    "plain": "tab:green",
    "rocketmq": "tab:red",
    "spark-sink/kafka": "tab:purple",
    "spark-sink/txbridge": "tab:cyan",
}
#: What each Spark sink's numbers mean (the fifth comparison, ``spark_pipelines/sink_compare.py``).
SINK_MEANING = {
    "spark-sink/kafka": (
        'Spark\'s Kafka sink (`format("kafka")`) is at-least-once: the rows a failed task wrote '
        "before it failed are written again by its retry, and the rows of the batch the killed "
        "driver had not committed are written again when the restarted driver runs the batch again"
    ),
    "spark-sink/txbridge": (
        'the txbridge sink (`format("txbridge")`) publishes each row once: the failed attempt\'s and '
        "the killed driver's transactions are rolled back, and only the transactions in the batch's "
        "decision record are committed"
    ),
}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def title_of(metrics: Sequence[PathMetrics]) -> str:
    """``txbridge vs Kafka transactions vs ...``, for the paths in ``metrics``."""
    paths = dict.fromkeys(m.path for m in metrics)
    return " vs ".join(PATH_TITLES.get(p, p) for p in paths)


def table(metrics: Sequence[PathMetrics], title: str | None = None) -> Table:
    """The comparison as a rich table, one row per path and isolation level."""
    out = Table(title=title or title_of(metrics))
    for name in ("path", "isolation", "records", *COUNT_COLUMNS, "p50 ms", "p99 ms"):
        out.add_column(name.replace("_", " "), justify="left" if name in ("path", "isolation") else "right")
    for m in metrics:
        out.add_row(
            m.path,
            m.isolation,
            str(m.records),
            *(str(getattr(m, c)) for c in COUNT_COLUMNS),
            _ms(m.latency_p50_ms),
            _ms(m.latency_p99_ms),
        )
    return out


def save_metrics(
    run_dir: Path,
    metrics: Sequence[PathMetrics],
    samples: Mapping[tuple[str, str], Sequence[int]],
    info: Mapping[str, Any],
) -> Path:
    """Write ``metrics.json``: the numbers, the latency samples and facts about the run."""
    body = {
        "info": dict(info),
        "metrics": [m.as_dict() for m in metrics],
        "latency_samples": {f"{p}/{i}": list(v) for (p, i), v in samples.items()},
    }
    target = run_dir / "metrics.json"
    target.write_text(json.dumps(body, indent=1))
    return target


def load_metrics(run_dir: Path) -> tuple[list[PathMetrics], dict[tuple[str, str], list[int]], dict[str, Any]]:
    """Read back what :func:`save_metrics` wrote.

    Raises:
        FileNotFoundError: ``run_dir`` holds no metrics.json.
    """
    body = json.loads((run_dir / "metrics.json").read_text())
    metrics = [PathMetrics(**m) for m in body["metrics"]]
    samples: dict[tuple[str, str], list[int]] = {}
    for name, values in body["latency_samples"].items():
        path, isolation = name.rsplit("/", 1)  # a path may hold a slash (spark-sink/kafka)
        samples[(path, isolation)] = values
    return metrics, samples, body["info"]


def _charts(
    run_dir: Path, metrics: Sequence[PathMetrics], samples: Mapping[tuple[str, str], Sequence[int]]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ("delivered", "lost", "phantom", "duplicates", "order_violations")
    committed_views = [m for m in metrics if m.isolation == "read_committed"]
    paths = list(dict.fromkeys(m.path for m in metrics))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=False)
    for ax, isolation in zip(axes, ("read_committed", "read_uncommitted"), strict=True):
        rows = {m.path: m for m in metrics if m.isolation == isolation}
        # One slot per path in both panels, so a path keeps its place and colour.
        width = 0.8 / max(len(paths), 1)
        for i, path in enumerate(paths):
            m = rows.get(path)
            if m is None:
                continue
            xs = [j + i * width for j in range(len(shown))]
            ax.bar(xs, [getattr(m, c) for c in shown], width=width, label=path, color=PATH_COLOURS.get(path))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shown))])
        ax.set_xticklabels(["delivered", "lost", "phantom", "duplicates", "order viol."], fontsize=8)
        ax.set_yscale("symlog")
        ax.set_title(isolation)
        absent = [p for p in paths if p not in rows]
        if absent:
            # RocketMQ has one view (its consumers see committed transactions only); the Spark
            # sinks are read with read_committed only.
            ax.text(
                0.5,
                -0.16,
                f"{', '.join(absent)}: no {isolation} view",
                transform=ax.transAxes,
                ha="center",
                fontsize=8,
            )
        ax.legend()
    fig.suptitle("events per path (symlog scale)")
    fig.tight_layout()
    fig.savefig(run_dir / "counts.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in committed_views:
        values = sorted(samples.get((m.path, m.isolation), []))
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            label = f"{m.path} (n={len(values)})"
            ax.step(values, ys, where="post", label=label, color=PATH_COLOURS.get(m.path))
    ax.set_xscale("symlog")
    ax.set_xlabel("DB commit to first seen by a read_committed consumer (RocketMQ: its consumer), ms")
    ax.set_ylabel("fraction of orders")
    ax.set_title("commit-to-visible latency, read_committed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "latency.png", dpi=110)
    plt.close(fig)


def _rocketmq_section(facts: Mapping[str, Any]) -> list[str]:
    """The report's RocketMQ section: where it ran, its transaction settings, what checks did."""
    lines = ["## RocketMQ", ""]
    where = "started by the demo" if facts.get("started_by_demo") else "an existing RocketMQ"
    lines.append(f"- broker: {where}, proxy {facts.get('endpoint')}, name server {facts.get('namesrv')}")
    if facts.get("start_s") is not None:
        lines.append(f"- start-up: {facts['start_s']} s")
    settings: Mapping[str, Any] = facts.get("transaction_settings") or {}
    defaults: Mapping[str, Any] = facts.get("rocketmq_defaults") or {}
    if settings:
        lines += ["", "Transaction settings the broker reported (`mqadmin getBrokerConfig`):", ""]
        lines += ["| setting | value | RocketMQ default |", "|---|---|---|"]
        lines += [f"| {k} | {v} | {defaults.get(k, '')} |" for k, v in settings.items()]
    else:
        lines.append("- transaction settings: could not be read from the broker")
    if facts.get("settings_reason"):
        lines += ["", str(facts["settings_reason"])]
    lines.append("")
    for key, value in facts.items():
        if key in _ROCKETMQ_FACTS_SHOWN:
            continue
        lines.append(f"- {key}: {value}")
    return [*lines, ""]


_ROCKETMQ_FACTS_SHOWN = frozenset(
    {
        "started_by_demo",
        "endpoint",
        "namesrv",
        "start_s",
        "transaction_settings",
        "rocketmq_defaults",
        "settings_reason",
    }
)


def sink_sentences(metrics: Sequence[PathMetrics]) -> list[str]:
    """One sentence per Spark sink in ``metrics``: its numbers and what they mean."""
    lines = []
    for m in metrics:
        if m.path in SINK_MEANING:
            lines.append(
                f"{m.path}: of {m.committed} rows, {m.lost} lost, {m.duplicates} duplicated, "
                f"{m.order_violations} reordered within their key (read_committed); "
                f"{SINK_MEANING[m.path]}."
            )
    return lines


def summary_lines(metrics: Sequence[PathMetrics], info: Mapping[str, Any]) -> list[str]:
    """What the terminal shows under the table: a sentence per Spark sink, then txbridge's
    commit-to-visible split by kind of order."""
    from spark_pipelines.latency_split import sentences

    lines = sink_sentences(metrics)
    if info.get("txbridge_latency"):
        lines.append("txbridge's commit-to-visible p50 / p99 ms, by kind of order (docs/demo.md):")
        lines += [f"  {line}" for line in sentences(info["txbridge_latency"])]
    return lines


def _sink_section(metrics: Sequence[PathMetrics], facts: Mapping[str, Any]) -> list[str]:
    """The report's section on the fifth comparison: the faults, then a sentence per sink."""
    lines = [
        "## Spark as the producer",
        "",
        "The same rows written by two streaming queries of one Spark driver, one through Spark's Kafka "
        "sink and one through txbridge's, under the same faults: a write task that fails after "
        f"{facts.get('rows_written_before_the_task_failure')} rows and is retried by Spark, and the driver "
        "SIGKILLed mid-batch and restarted from its checkpoints. Read back with read_committed.",
        "",
    ]
    lines += [f"- {line}" for line in sink_sentences(metrics)]
    lines.append("")
    lines += [f"- {key}: {value}" for key, value in facts.items()]
    return [*lines, ""]


def _txbridge_latency_section(figures: Mapping[str, Any]) -> list[str]:
    """Where txbridge's commit-to-visible time went: one row per kind of order, split at the op
    record's append time and the republished record's CreateTime."""
    from spark_pipelines.latency_split import KINDS, PARTS
    from spark_pipelines.latency_split import quantiles_text as ms

    lines = [
        "## Where txbridge's commit-to-visible time went",
        "",
        "p50 / p99 ms of the orders read_committed, split at the op record's append time and the "
        "republished record's CreateTime: producer = DB commit -> op record appended, republish = "
        "-> the coordinator's produce, visible = -> first received (the coordinator's Kafka commit "
        "and the watcher's fetch). `prompt` is what compares with native Kafka transactions, which "
        "hold nothing back (docs/demo.md).",
        "",
        "| orders | n | whole | " + " | ".join(PARTS) + " |",
        "|---|---|---|" + "---|" * len(PARTS),
    ]
    for kind in KINDS:
        f = figures.get(kind) or {}
        if f.get("orders"):
            cells = [kind, str(f["orders"]), ms(f["whole"]), *(ms(f[p]) for p in PARTS)]
            lines.append("| " + " | ".join(cells) + " |")
    if figures.get("unsplit"):
        lines += ["", f"{figures['unsplit']} committed orders were not seen or had no op record: not split."]
    return [*lines, ""]


def write_report(
    run_dir: Path,
    metrics: Sequence[PathMetrics],
    samples: Mapping[tuple[str, str], Sequence[int]],
    info: Mapping[str, Any],
) -> Path:
    """Write ``report.md`` with its charts (and ``metrics.json``); return the Markdown path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_metrics(run_dir, metrics, samples, info)
    _charts(run_dir, metrics, samples)
    header = ["path", "isolation", "records", *COUNT_COLUMNS, "p50 ms", "p99 ms", "latency n"]
    skipped: Mapping[str, str] = info.get("skipped") or {}
    lines = [
        f"# txbridge side-by-side report: {info.get('run_id', run_dir.name)}",
        "",
        f"{title_of(metrics)}. Metric definitions: docs/demo.md.",
        "",
        *(f"**{path} was skipped** ({why})." for path, why in skipped.items()),
        *([""] if skipped else []),
        "## Run",
        "",
        *(
            f"- {k}: {v}"
            for k, v in info.items()
            if k not in ("rocketmq", "skipped", "spark_sink", "txbridge_latency")
        ),
        "",
        "## Results",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for m in metrics:
        cells = [m.path, m.isolation, str(m.records), *(str(getattr(m, c)) for c in COUNT_COLUMNS)]
        cells += [_ms(m.latency_p50_ms), _ms(m.latency_p99_ms), str(m.latency_n)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![counts](counts.png)", "", "![latency](latency.png)", ""]
    if info.get("txbridge_latency"):
        lines += _txbridge_latency_section(info["txbridge_latency"])
    if info.get("spark_sink"):
        lines += _sink_section(metrics, info["spark_sink"])
    if info.get("rocketmq"):
        lines += _rocketmq_section(info["rocketmq"])
    target = run_dir / "report.md"
    target.write_text("\n".join(lines))
    return target
