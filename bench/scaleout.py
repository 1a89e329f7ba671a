"""Coordinators scaled out: the same workload through 1, 2 and 4 coordinator processes, and a
coordinator added then one removed (SIGTERM) under a steady load.

``scale_out`` gives one figure per fleet size: saturated throughput (counted visible by a
read_committed consumer of the real topic), each coordinator's CPU per message it republished,
partitions per instance, and commit-to-visible latency at one open-loop rate shared by every
size (half the one-coordinator saturated rate), so the rows compare directly. On a machine with
few cores the total cannot grow much: the per-instance cost is what scales.

``add_remove`` keeps a steady load on every half partition, starts a second coordinator, waits
until the group has balanced, then SIGTERMs the first. Every committed transaction must be seen
exactly once by a read_committed consumer reading the whole topic (anything else raises
:class:`BenchError`: it is a failure of the run, not a figure); the figures are how long
publishing paused around each event.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from bench import txbridge_runs as tb
from bench.kafka_native import BenchError, CpuMeter, Figure, broker_pid, payload
from servers.broker import free_port
from servers.coordinator_process import CoordinatorProcess
from txbridge import kafka
from txbridge.kafka import TopicPartition
from txbridge.transaction import Message
from txbridge.wire import H_TX, TxState, header_dict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaleOptions:
    """How big the two steps are.

    Attributes:
        counts: fleet sizes of the scale-out step.
        messages: committed transactions of each saturated run.
        latency_s: seconds of each open-loop latency run.
        rate: transactions per second of the add/remove step's steady load.
        phase_s: seconds of steady load before the add, after the group balanced, and after
            the removal.
        idle_s: seconds each fleet's idle CPU is measured, before its load.
        dynamic: also run the add/remove step with ``static_membership = false`` (a SIGTERMed
            coordinator leaves the group at once instead of after the session timeout).
    """

    counts: tuple[int, ...]
    messages: int
    latency_s: float
    rate: float
    phase_s: float
    dynamic: bool
    idle_s: float


OPTIONS = {
    "quick": ScaleOptions(
        counts=(1, 2), messages=2_000, latency_s=3.0, rate=100.0, phase_s=2.0, dynamic=False, idle_s=2.0
    ),
    "full": ScaleOptions(
        counts=(1, 2, 4), messages=20_000, latency_s=10.0, rate=200.0, phase_s=8.0, dynamic=True, idle_s=5.0
    ),
}


class Fleet:
    """Coordinator processes on one namespace, each serving metrics on a port of its own."""

    def __init__(self, env: tb.Env, ns: str, name: str, args: Sequence[str] = ()) -> None:
        self.env = env
        self.ns = ns
        self.name = name
        self.args = tuple(args)
        self.members: list[tuple[CoordinatorProcess, int]] = []
        self.removed: set[int] = set()

    def add(self) -> CoordinatorProcess:
        """Start one more coordinator (it joins the group in the background)."""
        port = free_port()
        coordinator = self.env.coordinator(
            self.ns, f"{self.name}-{len(self.members)}", "--metrics-port", str(port), *self.args
        )
        self.members.append((coordinator.start(), port))
        return coordinator

    def live(self) -> list[tuple[CoordinatorProcess, int]]:
        return [(c, port) for c, port in self.members if c.alive()]

    def metric(self, name: str) -> list[float]:
        """``name`` from every live coordinator, in start order (-1 when it cannot be read yet)."""
        values = []
        for _coordinator, port in self.live():
            try:
                values.append(tb._metric(port, name))
            except (OSError, urllib.error.URLError):
                values.append(-1.0)
        return values

    def wait_balanced(self, timeout: float = 120.0) -> list[int]:
        """Wait until every live coordinator owns partitions and together they own all of them.

        Returns:
            The partitions of each live coordinator.

        Raises:
            BenchError: not balanced within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        parts: list[float] = []
        while time.monotonic() < deadline:
            for i, (coordinator, _port) in enumerate(self.members):
                if i not in self.removed and not coordinator.alive():
                    raise BenchError(f"{self.name}: a coordinator exited:\n{coordinator.log_tail()}")
            parts = self.metric("assigned_partitions")
            if parts and min(parts) > 0 and sum(parts) == tb.PARTITIONS:
                return [int(p) for p in parts]
            time.sleep(0.1)
        raise BenchError(f"{self.name}: the coordinators did not balance within {timeout:.0f}s: {parts}")

    def remove(self, index: int) -> int | None:
        """SIGTERM member ``index`` and wait for it to exit. Returns its exit code."""
        self.removed.add(index)
        return self.members[index][0].stop()

    def stop(self) -> None:
        for coordinator, _port in self.members:
            coordinator.stop()


class FleetMeter(CpuMeter):
    """CPU of the broker (when local) and of every coordinator of a fleet over a measured window,
    with what each coordinator republished meanwhile (its ``messages_republished`` counter)."""

    def __init__(self, fleet: Fleet, broker_pid: int | None) -> None:
        live = fleet.live()
        super().__init__({"broker": broker_pid, **{f"c{i}": c.pid for i, (c, _port) in enumerate(live)}})
        self._fleet = fleet
        self._republished: list[float] = []
        #: Per coordinator, after :meth:`per_message`: (CPU s, messages republished).
        self.instances: list[tuple[float, float]] = []

    def start(self) -> None:
        super().start()
        self._republished = self._fleet.metric("messages_republished")

    def per_message(self, messages: int) -> dict[str, float]:
        out = super().per_message(messages)
        # A coordinator counts its messages once its Kafka transaction returned, a moment after
        # a consumer may have seen them.
        deadline = time.monotonic() + 5
        while True:
            republished = [
                after - before
                for before, after in zip(
                    self._republished, self._fleet.metric("messages_republished"), strict=True
                )
            ]
            if sum(republished) >= messages or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        cpu = [out.pop(f"c{i}_cpu_us_per_msg", 0.0) * messages / 1e6 for i in range(len(republished))]
        self.instances = list(zip(cpu, republished, strict=True))
        per_instance = [c / r * 1e6 for c, r in self.instances if r > 0]
        out["coordinator_cpu_us_per_msg"] = sum(cpu) / messages * 1e6 if messages else 0.0
        out["instance_cpu_us_per_msg_min"] = min(per_instance, default=0.0)
        out["instance_cpu_us_per_msg_max"] = max(per_instance, default=0.0)
        return out


def scale_out(
    env: tb.Env,
    *,
    size: int,
    counts: Iterable[int],
    messages: int,
    in_flight: int,
    latency_s: float,
    idle_s: float = 2.0,
    broker_pid: int | None = None,
) -> list[Figure]:
    """One figure per fleet size in ``counts``: the same saturated run and the same open-loop
    latency run through that many coordinators on a namespace of its own."""
    figures: list[Figure] = []
    rate: float | None = None
    for n in counts:
        fleet = Fleet(env, env.namespace(f"scale{n}"), f"scale{n}")
        try:
            for _ in range(n):
                fleet.add()
            partitions = fleet.wait_balanced()
            idle = idle_cpu(fleet, idle_s)
            meter = FleetMeter(fleet, broker_pid)
            e2e = tb.end_to_end(env, fleet.ns, size=size, count=messages, concurrency=in_flight, meter=meter)
            # A loaded machine can miss a heartbeat: the row is kept, and says so.
            after = [int(p) for p in fleet.metric("assigned_partitions")]
            rebalanced = sorted(after) != sorted(partitions)
            if rebalanced:
                logger.warning("%d coordinators: the group rebalanced during the run (%s)", n, after)
            rate = rate or max(10.0, e2e.msgs_per_s / 2)
            latency = tb.latency(env, fleet.ns, size=size, rate=rate, duration_s=latency_s)
        finally:
            fleet.stop()
        republished = sum(r for _c, r in meter.instances)
        figures.append(
            Figure(
                f"scale-out, {n} coordinator{'s' if n > 1 else ''}",
                e2e.messages,
                e2e.seconds,
                {
                    "msgs_per_s": e2e.msgs_per_s,
                    **{k: v for k, v in e2e.values.items() if k.endswith("_cpu_us_per_msg")},
                    "instance_cpu_us_per_msg_min": e2e.values.get("instance_cpu_us_per_msg_min", 0.0),
                    "instance_cpu_us_per_msg_max": e2e.values.get("instance_cpu_us_per_msg_max", 0.0),
                    "instance_idle_cpu_ms_per_s": sum(idle) / len(idle),
                    "partitions_per_instance_min": float(min(partitions)),
                    "partitions_per_instance_max": float(max(partitions)),
                    "latency_rate_msgs_per_s": rate,
                    "p50_ms": latency.values["p50_ms"],
                    "p99_ms": latency.values["p99_ms"],
                    "max_ms": latency.values["max_ms"],
                },
                {
                    "coordinators": n,
                    "size": size,
                    "count": messages,
                    "concurrency": in_flight,
                    "partitions": partitions,
                    "rebalanced_during_run": rebalanced,
                    "republished": republished,
                    "instances": [{"cpu_s": round(c, 3), "republished": int(r)} for c, r in meter.instances],
                    "latency_s": latency_s,
                },
            )
        )
    return figures


def idle_cpu(fleet: Fleet, seconds: float) -> list[float]:
    """Each live coordinator's CPU ms per second over ``seconds`` with no load (its commit interval,
    heartbeats and polls: the cost of an instance before any message)."""
    procs = [psutil.Process(c.pid) for c, _port in fleet.live() if c.pid is not None]

    def cpu() -> list[float]:
        return [sum(p.cpu_times()[:2]) for p in procs]

    before, began = cpu(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = cpu(), time.monotonic() - began
    return [(b - a) / elapsed * 1000 for a, b in zip(before, after, strict=True)]


def longest_gap(times: Iterable[float], start: float, end: float) -> float:
    """The longest wait between consecutive ``times`` that ended in ``(start, end]``: a pause is
    the event's whose window it ends in (it began before the event, with the last message)."""
    ordered = sorted(times)
    return max((b - a for a, b in itertools.pairwise(ordered) if start < b <= end), default=0.0)


def pauses(
    committed: Mapping[str, tuple[int, float]], seen: Mapping[str, float], start: float, end: float
) -> dict[str, float]:
    """How publishing paused in ``[start, end)``: the longest gap between visible messages on one
    half partition and on the whole topic, and the worst commit-to-visible of what committed in it."""
    by_partition: dict[int, list[float]] = {}
    for tx, (partition, _at) in committed.items():
        if tx in seen:
            by_partition.setdefault(partition, []).append(seen[tx])
    return {
        "partition_pause_s": max((longest_gap(t, start, end) for t in by_partition.values()), default=0.0),
        "topic_pause_s": longest_gap(seen.values(), start, end),
        "max_visible_s": max(
            (seen[tx] - at for tx, (_p, at) in committed.items() if start <= at < end and tx in seen),
            default=0.0,
        ),
    }


class _Scenario(threading.Thread):
    """After ``phase_s`` of load: add a coordinator, wait for the balance, ``phase_s`` later SIGTERM
    the first, wait for the balance, ``phase_s`` more; then set ``done`` (the load stops)."""

    def __init__(self, fleet: Fleet, phase_s: float) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.phase_s = phase_s
        self.events: dict[str, float] = {}
        self.done = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the load's thread (add_remove)
            self.failure = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        time.sleep(self.phase_s)
        self.events["add"] = time.time()
        self.fleet.add()
        self.fleet.wait_balanced()
        self.events["balanced"] = time.time()
        time.sleep(self.phase_s)
        self.events["remove"] = time.time()
        code = self.fleet.remove(0)
        if code != 0:
            tail = self.fleet.members[0][0].log_tail()
            raise BenchError(f"the SIGTERMed coordinator exited with {code}:\n{tail}")
        self.fleet.wait_balanced()
        self.events["rebalanced"] = time.time()
        time.sleep(self.phase_s)


def check_exactly_once(committed: Iterable[str], counts: Mapping[str, int], label: str) -> None:
    """Raises :class:`BenchError` unless every committed tx id was seen exactly once."""
    duplicates = sorted(tx for tx, n in counts.items() if n > 1)
    lost = sorted(tx for tx in committed if tx not in counts)
    if duplicates or lost:
        raise BenchError(
            f"{label}: not exactly once: {len(duplicates)} committed transactions seen "
            f"more than once (e.g. {duplicates[:3]}), {len(lost)} never (e.g. {lost[:3]})"
        )


def add_remove(
    env: tb.Env,
    *,
    size: int,
    rate: float,
    phase_s: float,
    static_membership: bool = True,
    group_protocol: str = "classic",
) -> Figure:
    """A second coordinator added, then the first SIGTERMed, under a steady load at ``rate``,
    the coordinators' group under ``group_protocol`` (``classic`` or ``consumer``).

    Raises:
        BenchError: a committed transaction was seen twice or never, or a step failed.
    """
    membership = "static" if static_membership else "dynamic"
    label = membership if group_protocol == "classic" else f"{membership}-{group_protocol}"
    settings = [] if static_membership else ["static_membership = false"]
    if group_protocol != "classic":
        settings.append(f'group_protocol = "{group_protocol}"')
    args: list[str] = []
    if settings:
        config = env.work / f"coordinator-{label}.toml"
        config.write_text("\n".join(settings) + "\n")
        args = ["--config", str(config)]
    fleet = Fleet(env, env.namespace(f"addrm-{label}"), f"addrm-{label}", args)
    topic = env.topic(f"addrm-{label}")
    scenario = _Scenario(fleet, phase_s)
    try:
        fleet.add()
        fleet.wait_balanced()
        watcher = tb.Watcher(env.bootstrap, topic, env.extra).start()
        try:
            started = time.time()
            scenario.start()
            committed, undecided = asyncio.run(
                _steady(env, fleet.ns, topic, size=size, rate=rate, done=scenario.done)
            )
            scenario.join()
            if scenario.failure is not None:
                raise BenchError(f"add/remove ({label}): {scenario.failure}") from scenario.failure
            watcher.wait(len(committed), 120)
            seen = dict(watcher.seen)
        finally:
            watcher.close()
        counts = read_topic(env, topic)
    finally:
        fleet.stop()
    check_exactly_once(committed, counts, f"add/remove ({label})")
    events, ended = scenario.events, max(seen.values())
    values = {"load_msgs_per_s": rate, "committed": float(len(committed)), "seen_once": float(len(committed))}
    for name, start, end in (
        ("steady", started + 1.0, events["add"]),
        ("add", events["add"], events["remove"]),
        ("remove", events["remove"], ended),
    ):
        values.update({f"{name}_{key}": value for key, value in pauses(committed, seen, start, end).items()})
    protocol = "" if group_protocol == "classic" else f", {group_protocol} protocol"
    title = f"{membership} membership{protocol}"
    return Figure(
        f"add + remove coordinator ({title})",
        len(committed),
        ended - started,
        values,
        {
            "rate": rate,
            "phase_s": phase_s,
            "static_membership": static_membership,
            "group_protocol": group_protocol,
            "add_to_balanced_s": round(events["balanced"] - events["add"], 3),
            "remove_to_balanced_s": round(events["rebalanced"] - events["remove"], 3),
            "undecided_at_producer": undecided,
            "messages_on_topic": sum(counts.values()),
        },
    )


def _commit(_txn: object, _arg: object) -> TxState:
    return TxState.COMMIT


async def _steady(
    env: tb.Env, ns: str, topic: str, *, size: int, rate: float, done: threading.Event
) -> tuple[dict[str, tuple[int, float]], int]:
    """Open-loop load over 240 keys (every half partition) until ``done``.

    Returns:
        {tx id: (half partition, wall time it committed)} and how many did not end COMMIT.
    """
    value = payload(size)
    keys = [str(i).encode() for i in range(240)]
    committed: dict[str, tuple[int, float]] = {}
    undecided = [0]
    async with env.producer(ns, "bench-scale", lambda _t: TxState.COMMIT) as producer:

        async def one(i: int) -> None:
            result = await producer.send_in_transaction(
                Message(topic, value, key=keys[i % len(keys)]), _commit
            )
            if result.state is TxState.COMMIT and result.partition is not None:
                committed[result.tx_id] = (result.partition, time.time())
            else:
                undecided[0] += 1

        began = time.time()
        tasks = []
        for i in itertools.count():
            if done.is_set():
                break
            delay = began + i / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return committed, undecided[0]


def read_topic(env: tb.Env, topic: str, timeout: float = 120.0, idle_s: float = 5.0) -> Counter[str]:
    """How many times each tx id is on ``topic``, for a read_committed consumer reading it whole.

    Raises:
        BenchError: the end was not reached within ``timeout``.
    """
    consumer = kafka.consumer(env.bootstrap, f"bench-verify-{env.run_id}", env.extra)
    counts: Counter[str] = Counter()
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        position = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        # A read_committed consumer's position may stay below a trailing commit marker: after
        # `idle_s` with nothing new (the watcher has seen every committed message already), done.
        while any(position[p] < ends[p] for p in parts) and time.monotonic() - last < idle_s:
            if time.monotonic() > deadline:
                raise BenchError(f"could not read {topic} to its end within {timeout:.0f}s")
            for msg in kafka.consume_available(consumer, 1000, 0.2):
                last = time.monotonic()
                if msg.error() is not None:
                    continue
                tx = header_dict(msg.headers()).get(H_TX)
                if tx:
                    counts[tx.decode()] += 1
            for tp in consumer.position([TopicPartition(topic, p) for p in parts]):
                position[tp.partition] = max(position[tp.partition], tp.offset)
    finally:
        consumer.close()
    return counts


def run(name: str, env: tb.Env, *, quick: bool, size: int, in_flight: int) -> list[Figure]:
    """The benchmark step ``name`` (``scaleout``, ``addremove`` or ``protocols``) at the quick or
    full scale."""
    scale = OPTIONS["quick" if quick else "full"]
    if name == "scaleout":
        return scale_out(
            env,
            size=size,
            counts=scale.counts,
            messages=scale.messages,
            in_flight=in_flight,
            latency_s=scale.latency_s,
            idle_s=scale.idle_s,
            broker_pid=broker_pid(env.bootstrap),
        )
    if name == "addremove":
        return [
            add_remove(env, size=size, rate=scale.rate, phase_s=scale.phase_s, static_membership=static)
            for static in ((True, False) if scale.dynamic else (True,))
        ]
    if name == "protocols":  # side by side: each membership under both protocols, one after the other
        return [
            add_remove(
                env,
                size=size,
                rate=scale.rate,
                phase_s=scale.phase_s,
                static_membership=static,
                group_protocol=protocol,
            )
            for static in (True, False)
            for protocol in ("classic", "consumer")
        ]
    raise ValueError(f"unknown scale-out step {name!r}")
