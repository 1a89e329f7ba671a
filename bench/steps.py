"""The benchmark's steps: a registry, in the order a run takes them (``txbridge bench --only/--skip``).

Each :class:`Step` names a function taking the run (:class:`StepRun`, implemented by
:class:`bench.runner.BenchRun`) and returning its figures, the step's own last.
The functions import the bench's modules when they run, so that this module, and with it the
command's options, needs neither psutil nor rich.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bench.kafka_native import CpuMeter, Figure
    from bench.rocketmq import Progress, RocketMQOptions
    from bench.txbridge_runs import Env

__all__ = ["MODES", "REGISTRY", "STEPS", "Mode", "Step", "StepRun", "lookup"]


@dataclass(frozen=True)
class Mode:
    """How much each step does: ``txbridge bench --quick`` or a full run."""

    raw_count: int
    native_s: float
    e2e_count: int
    #: Transactions through txbridge and through the floor in each warm-up round, not counted
    #: (see :func:`_side_by_side`).
    e2e_warmup: int
    latency_s: float
    checks: int
    pending: int
    #: Rounds the e2e and floor steps count in, alternated: each round counts a share of
    #: ``e2e_count`` through txbridge, then as many through the floor.
    e2e_draws: int = 1
    #: The most warm-up rounds; fewer once every side's rate has settled (:func:`settled`)
    #: and ``e2e_warmup_s`` have passed.
    e2e_warmup_rounds: int = 1
    #: The least time the warm-up rounds take, in seconds.
    e2e_warmup_s: float = 0.0


MODES = {
    "quick": Mode(
        raw_count=50_000,
        native_s=5.0,
        e2e_count=3_000,
        e2e_warmup=3_000,
        latency_s=5.0,
        checks=1_000,
        pending=10_000,
    ),
    "full": Mode(
        raw_count=500_000,
        native_s=20.0,
        # A 30,000-transaction count lasted about 3.5 s, short enough that one draw of the
        # txbridge / floor ratio ranged 0.58-0.91 on one evening: 90,000, in three rounds
        # alternated with the floor's. The warm-up: on a broker just started (and through the
        # raw and native steps), txbridge's broker CPU per message fell from 149 to 55 µs over
        # its first 60,000 transactions alternated with the floor's, and the floor's own took
        # longer still, one to two minutes of load (docs/results/2026-11-29-warm-broker.md):
        # rounds of 20,000 each for at least 90 s, and until both rates settle.
        e2e_count=90_000,
        e2e_warmup=20_000,
        latency_s=20.0,
        checks=10_000,
        pending=100_000,
        e2e_draws=3,
        e2e_warmup_rounds=20,
        e2e_warmup_s=90.0,
    ),
}


class StepRun(Protocol):
    """What a step uses of its run: the broker, the sizes, the shared coordinator, where to log."""

    @property
    def bootstrap(self) -> str: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def size(self) -> int: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def env(self) -> Env: ...
    @property
    def rocketmq(self) -> RocketMQOptions: ...
    @property
    def progress(self) -> Progress: ...

    def shared_namespace(self) -> str: ...

    def will_run(self, step: str) -> bool:
        """Whether this run takes ``step`` (``--only``/``--skip``), before or after this one."""
        ...

    @property
    def measured(self) -> dict[str, Figure]:
        """Figures a step measured for a later step (by that step's name), which returns them."""
        ...

    def meter(self, *, coordinator: bool = False, producer: bool = False) -> CpuMeter: ...

    def half_of_saturated(self) -> float: ...


@dataclass(frozen=True)
class Step:
    """One step of the benchmark: its ``--only``/``--skip`` name and what it measures."""

    name: str
    description: str
    run: Callable[[StepRun], Sequence[Figure]]


def _raw(run: StepRun) -> list[Figure]:
    from bench.kafka_native import raw_produce

    return [
        raw_produce(
            run.bootstrap,
            run.env.topic("raw"),
            size=run.size,
            count=run.mode.raw_count,
            meter=run.meter(),
            extra=run.extra,
        )
    ]


def _native(name: str, per_txn: int) -> Callable[[StepRun], list[Figure]]:
    def native(run: StepRun) -> list[Figure]:
        from bench.kafka_native import native_transactions

        figure = native_transactions(
            run.bootstrap,
            run.env.topic(name),
            size=run.size,
            per_txn=per_txn,
            duration_s=run.mode.native_s,
            concurrency=run.concurrency if per_txn == 1 else 2,
            meter=run.meter(),
            extra=run.extra,
        )
        return [figure]

    return native


def _e2e(run: StepRun) -> list[Figure]:
    if run.will_run("floor"):
        txbridge, floor = _side_by_side(run, ("txbridge", "floor"))
        run.measured["floor"] = floor
        return [txbridge]
    return list(_side_by_side(run, ("txbridge",)))


def _floor(run: StepRun) -> list[Figure]:
    # The same Kafka I/O as txbridge end to end with no txbridge logic: the best any
    # Python implementation of the protocol reaches here (what the ratios are up against).
    measured = run.measured.pop("floor", None)
    return [measured] if measured is not None else list(_side_by_side(run, ("floor",)))


def _side_by_side(run: StepRun, sides: tuple[str, ...]) -> tuple[Figure, ...]:
    """``sides`` (txbridge end to end, the floor) warmed up and counted in alternated rounds.

    A warm-up not counted, as RocketMQ's (rocketmq.py): the coordinator's first seconds (its
    clients joining, its producers' first transactions) and the broker's code for fetching,
    groups and transactions over many partitions, which the raw and native steps before do not
    warm. Both sides warm up, in alternated rounds for at least ``e2e_warmup_s`` and until their
    rates settle, before either is counted, and each counted round counts both, one right
    after the other: a broker still warming, or a box slowed for a minute, weighs on both
    sides alike instead of on whichever ran then (txbridge, run first, used to be counted on
    a broker the floor found warmed by it). Each side's figure is the sum of its rounds: its
    rate is all its messages over all its time, its CPU per message the rounds' mean (equal
    counts); ``params`` keeps each round's rate (``draws_msgs_per_s``) and each warm-up
    round's (``warmup_msgs_per_s``).
    """
    from bench import txbridge_runs as tb
    from bench.floor import floor
    from bench.kafka_native import NO_METER

    ns = run.shared_namespace() if "txbridge" in sides else ""  # starts the coordinator

    def draw(side: str, count: int, counted: bool) -> Figure:
        if side == "txbridge":
            meter = run.meter(coordinator=True) if counted else NO_METER
            return tb.end_to_end(
                run.env, ns, size=run.size, count=count, concurrency=run.in_flight, meter=meter
            )
        meter = run.meter() if counted else NO_METER
        return floor(
            run.bootstrap, size=run.size, count=count, in_flight=run.in_flight, meter=meter, extra=run.extra
        )[1]

    mode, rounds, names = run.mode, max(1, run.mode.e2e_draws), " and ".join(sides)
    warmup: dict[str, list[float]] = {side: [] for side in sides}
    began = time.monotonic()
    for number in range(1, max(1, mode.e2e_warmup_rounds) + 1):
        run.progress(
            f"warming up, round {number}: {mode.e2e_warmup:,} transactions through {names}, not counted ..."
        )
        for side in sides:
            warmup[side].append(draw(side, mode.e2e_warmup, counted=False).msgs_per_s)
        if time.monotonic() - began >= mode.e2e_warmup_s and settled(warmup):
            break
    draws: dict[str, list[Figure]] = {side: [] for side in sides}
    for number in range(1, rounds + 1):
        if rounds > 1:
            run.progress(
                f"round {number} of {rounds}: {mode.e2e_count // rounds:,} transactions through {names} ..."
            )
        for side in sides:
            draws[side].append(draw(side, max(1, mode.e2e_count // rounds), counted=True))
    summed = tuple(_summed(draws[side]) for side in sides)
    for side, figure in zip(sides, summed, strict=True):
        figure.params["warmup_msgs_per_s"] = [round(rate, 1) for rate in warmup[side]]
    return summed


#: A side's rate has settled when its last warm-up round is within this share of the one before.
WARM_TOLERANCE = 0.10


def settled(rates: Mapping[str, Sequence[float]]) -> bool:
    """Whether every side's warm-up rate has settled: its last two rounds within :data:`WARM_TOLERANCE`."""
    return all(
        len(r) >= 2 and r[-2] > 0 and abs(r[-1] - r[-2]) <= WARM_TOLERANCE * r[-2] for r in rates.values()
    )


def _summed(draws: list[Figure]) -> Figure:
    """One figure of equal-count draws of one side: its rate over all of them, the mean of the rest."""
    from bench.kafka_native import Figure

    if len(draws) == 1:
        return draws[0]
    messages, seconds = sum(d.messages for d in draws), sum(d.seconds for d in draws)
    values = {key: sum(d.values.get(key, 0.0) for d in draws) / len(draws) for key in draws[0].values}
    values["msgs_per_s"] = messages / seconds
    if "mb_per_s" in values:
        values["mb_per_s"] = sum(d.values["mb_per_s"] * d.seconds for d in draws) / seconds
    params = {
        **draws[0].params,
        "count": messages,
        "draws_msgs_per_s": [round(d.msgs_per_s, 1) for d in draws],
    }
    return Figure(draws[0].name, messages, seconds, values, params)


def _latency(run: StepRun) -> list[Figure]:
    from bench import txbridge_runs as tb

    ns, rate = run.shared_namespace(), run.half_of_saturated()
    meter = run.meter(coordinator=True)  # the broker's CPU at a rate both latency steps share
    return [tb.latency(run.env, ns, size=run.size, rate=rate, duration_s=run.mode.latency_s, meter=meter)]


def _floor_latency(run: StepRun) -> list[Figure]:
    # The floor's Kafka I/O at txbridge's latency rate: the two latency rows compare directly.
    from bench.floor import floor_latency

    rate, duration_s = run.half_of_saturated(), run.mode.latency_s
    figure = floor_latency(
        run.bootstrap, size=run.size, rate=rate, duration_s=duration_s, extra=run.extra, meter=run.meter()
    )
    return [figure]


def _checks(run: StepRun) -> list[Figure]:
    from bench import txbridge_runs as tb

    return [tb.backcheck_drain(run.env, size=run.size, count=run.mode.checks, concurrency=run.in_flight)]


def _memory(run: StepRun) -> list[Figure]:
    from bench import txbridge_runs as tb

    return [tb.memory(run.env, size=run.size, pending=run.mode.pending, cache_bytes=16 * 2**20)]


def _failover(run: StepRun) -> list[Figure]:
    # A kill at a random moment, then one that leaves its Kafka transaction open.
    from bench import txbridge_runs as tb

    return tb.failovers(run.env, size=run.size)


def _restart(run: StepRun) -> list[Figure]:
    from bench import txbridge_runs as tb

    return [tb.restart(run.env, size=run.size)]


def _renamed(run: StepRun) -> list[Figure]:
    from bench import txbridge_runs as tb

    return [tb.renamed(run.env, size=run.size)]


def _scaleout(name: str) -> Callable[[StepRun], list[Figure]]:
    # The same workload through 1, 2 (and 4) coordinators; one added and one SIGTERMed under load.
    def scaleout_step(run: StepRun) -> list[Figure]:
        from bench import scaleout

        quick = run.mode == MODES["quick"]
        return scaleout.run(name, run.env, quick=quick, size=run.size, in_flight=run.in_flight)

    return scaleout_step


def _nodekill(run: StepRun) -> list[Figure]:
    # On a secured 3-node cluster of its own, whatever the run's bootstrap: nodes SIGKILLed
    # under txbridge and under native transactions at the same rate; in full mode, then the
    # standby takeover on that cluster.
    from bench import node_kill

    options = node_kill.OPTIONS["quick" if run.mode == MODES["quick"] else "full"]
    return node_kill.run(options, run.env.work, size=run.size, progress=run.progress)


def _rocketmq(run: StepRun) -> list[Figure]:
    # The real RocketMQ with txbridge's message size and in-flight count; its figures come first.
    from bench import rocketmq
    from bench import txbridge_runs as tb
    from bench.after_decision import after_decision_latency

    m = run.mode

    def txbridge_latency(rate: float) -> Figure:
        ns = run.shared_namespace()
        # The broker, the coordinator and this process (the producer): what a lone transaction
        # costs each at this rate, set against the Kafka transaction's alone below.
        meter = run.meter(coordinator=True, producer=True)
        return tb.latency(run.env, ns, size=run.size, rate=rate, duration_s=m.latency_s, meter=meter)

    rate = run.half_of_saturated()
    comparison = rocketmq.Comparison(run.size, run.in_flight, m.native_s, m.latency_s, rate)
    figures = rocketmq.run(
        run.rocketmq, comparison, run.env.work, txbridge_latency=txbridge_latency, progress=run.progress
    )
    # What a Kafka transaction alone costs after the decision, at the same rate: the part of
    # txbridge's commit-to-visible no republisher over Kafka transactions can avoid.
    same_rate = next(f.values["rate_msgs_per_s"] for f in figures if f.name == "rocketmq commit-to-visible")
    run.progress(f"a Kafka transaction begun after the decision, at the same {same_rate:,.0f} msgs/s ...")
    figures.append(
        after_decision_latency(
            run.bootstrap,
            run.env.topic("decided"),
            run.env.topic("decided-state", partitions=1),
            size=run.size,
            rate=same_rate,
            duration_s=m.latency_s,
            extra=run.extra,
            meter=run.meter(producer=True),
        )
    )
    return figures


def _registry(*steps: Step) -> dict[str, Step]:
    registry = {step.name: step for step in steps}
    if len(registry) != len(steps):
        raise ValueError(f"benchmark steps registered twice: {[s.name for s in steps]}")
    return registry


#: Every step by name, in the order a run takes them.
REGISTRY: Mapping[str, Step] = _registry(
    Step("raw", "raw idempotent produce", _raw),
    Step("native1", "native Kafka transactions, one message each", _native("native1", 1)),
    Step("native100", "native Kafka transactions, 100 messages each", _native("native100", 100)),
    Step("e2e", "txbridge end to end, counted visible on the real topic", _e2e),
    Step("floor", "the same Kafka I/O as e2e with no txbridge logic", _floor),
    Step("latency", "txbridge commit-to-visible at half the saturated rate", _latency),
    Step("floor_latency", "the floor's commit-to-visible at the same rate", _floor_latency),
    Step("checks", "back-check drain of transactions answering UNKNOWN", _checks),
    Step("memory", "coordinator memory with many pending transactions", _memory),
    Step("failover", "a coordinator SIGKILLed under load, a standby takes over", _failover),
    Step("restart", "a coordinator SIGKILLed and restarted with its instance id", _restart),
    Step("renamed", "a coordinator SIGKILLed and replaced by one under a new instance id", _renamed),
    Step("scaleout", "the same load through 1, 2 (and 4) coordinators", _scaleout("scaleout")),
    Step("addremove", "a coordinator added, then one SIGTERMed, under load", _scaleout("addremove")),
    Step(
        "protocols",
        "addremove under the classic and the consumer (KIP-848) group protocol, side by side",
        _scaleout("protocols"),
    ),
    Step("nodekill", "Kafka nodes SIGKILLed on a secured 3-node cluster", _nodekill),
    Step("rocketmq", "the real RocketMQ's transactional messages, same size and load", _rocketmq),
)

#: The steps' names, in order (``--only``/``--skip`` choices).
STEPS = tuple(REGISTRY)


def lookup(name: str) -> Step:
    """The step called ``name``; a :class:`ValueError` naming the known ones if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown benchmark step {name!r}; known: {', '.join(STEPS)}") from None
