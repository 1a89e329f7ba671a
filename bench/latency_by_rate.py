"""Commit-to-visible by rate: txbridge and the floor alternated at several open-loop rates.

``python -m bench.latency_by_rate [--bootstrap 127.0.0.1:9092] [--rates 1500,3000,6000]
[--paces 0] [--seconds 20] [--rounds 2]``

The bench measures issue 41's latency goal at one rate, half of txbridge's saturated rate. On a
2-core box that rate keeps txbridge's processes busier than the floor's (more client CPU per
message), so the ratio mixes two causes: what a commit costs, and the queueing for CPU. Timing
both sides over several rates tells them apart: the part that stays at low rates is the
protocol's, the part that grows with the rate is the queueing.

Each round runs every rate, txbridge then the floor, with the bench's own steps
(:func:`bench.txbridge_runs.latency`, :func:`bench.floor.floor_latency`). ``--paces`` runs
txbridge once per ``commit_pace_ms`` value, each under a coordinator of its own started with
that pace (``TXBRIDGE_COMMIT_PACE_MS``). Every coordinator first runs an uncounted 8 s at the
rate. Prints one line per run: p50, p99, the split at the op's append time and the
republished record's CreateTime, and the broker's (and coordinator's) CPU per message when
the broker is a process of this machine. The box is usually shared: read each rate's ratio
from its own round.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from bench import txbridge_runs as tb
from bench.floor import floor_latency
from bench.kafka_native import Figure
from bench.runner import BenchRun
from bench.steps import MODES

#: The environment variable the coordinators this tool starts read their pace from.
PACE_ENV = "TXBRIDGE_COMMIT_PACE_MS"
WARM_S = 8.0
SIZE = 512


def _line(side: str, rate: float, figure: Figure) -> str:
    values = figure.values

    def ms(part: str) -> str:
        return f"{values.get(f'p50 ms, {part}', float('nan')):5.1f}"

    cpu = f"broker {values.get('broker_cpu_us_per_msg', 0):4.0f} µs/msg"
    if "coordinator_cpu_us_per_msg" in values:
        cpu += f", coordinator {values['coordinator_cpu_us_per_msg']:4.0f}"
    return (
        f"{side:18s} {rate:7,.0f} msgs/s  p50 {values['p50_ms']:6.1f}  p99 {values['p99_ms']:7.1f} ms"
        f" | decision→op {ms('decision to op appended')} → republished {ms('op to republished')}"
        f" → visible {ms('republished to visible')} | {cpu}"
    )


def _txbridge(bootstrap: str, rate: float, seconds: float, pace: int | None) -> Figure:
    """One coordinator (with ``pace``, or the configured one), warmed at ``rate``, then timed."""
    before = os.environ.get(PACE_ENV)
    if pace is not None:
        os.environ[PACE_ENV] = str(pace)
    try:
        with BenchRun(bootstrap, MODES["full"], size=SIZE, concurrency=8, in_flight=256) as run:
            ns = run.shared_namespace()
            tb.latency(run.env, ns, size=SIZE, rate=rate, duration_s=WARM_S)
            return tb.latency(
                run.env, ns, size=SIZE, rate=rate, duration_s=seconds, meter=run.meter(coordinator=True)
            )
    finally:
        if before is None:
            os.environ.pop(PACE_ENV, None)
        else:
            os.environ[PACE_ENV] = before


def _floor(bootstrap: str, rate: float, seconds: float) -> Figure:
    with BenchRun(bootstrap, MODES["full"], size=SIZE, concurrency=8, in_flight=256) as run:
        return floor_latency(bootstrap, size=SIZE, rate=rate, duration_s=seconds, meter=run.meter())


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--rates", default="1500,3000,6000", help="open-loop msgs/s, comma-separated")
    parser.add_argument(
        "--paces", default="", help="commit_pace_ms values, comma-separated (default: the configured one)"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        args.rates = [float(r) for r in args.rates.split(",")]
        args.paces = [int(p) for p in args.paces.split(",")] if args.paces else [None]
    except ValueError as exc:
        parser.error(f"--rates and --paces take comma-separated numbers: {exc}")
    if any(rate <= 0 for rate in args.rates):
        parser.error("--rates must be above 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for round_ in range(1, args.rounds + 1):
        print(f"round {round_} of {args.rounds}", flush=True)
        for rate in args.rates:
            for pace in args.paces:
                side = "txbridge" if pace is None else f"txbridge pace {pace}"
                print(_line(side, rate, _txbridge(args.bootstrap, rate, args.seconds, pace)), flush=True)
            print(_line("floor", rate, _floor(args.bootstrap, rate, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
