"""A nemesis for the secured 3-node cluster: seeded, random faults of its nodes, of the
coordinator processes and of the SDK producer processes, under load (``test_nemesis.py``).

The schedule is data: :func:`draw_schedule` draws, from ``random.Random(seed)`` alone, a list
of :class:`Step` (when, which fault, on what, for how long), so a seed names a run and a
failing one can be replayed (``TXBRIDGE_CHAOS_SEEDS=<seed> TXBRIDGE_CHAOS_SECONDS=<seconds>``).
:class:`Nemesis` applies it. The faults, and how each is applied:

- ``node-kill``: SIGKILL one node (a crash); start it again after ``hold`` seconds.
- ``rolling-restart``: every node in turn, as an upgrade does: SIGTERM (Kafka's controlled
  shutdown moves its leaders away first), start it again after ``hold``, wait until every
  replica is in sync, then the next node.
- ``coordinator-kill``: SIGKILL a coordinator; after ``hold``, start it again under the same
  instance id, or (``renamed``) a new process under a new one.
- ``coordinator-pause``: SIGSTOP a coordinator past its session timeout (12 s on a cluster), so that the
  group gives its partitions to another; then SIGCONT: a zombie that must be fenced.
- ``coordinator-term``: SIGTERM a coordinator (a clean stop); after ``hold``, start it again
  under the same or a new instance id.
- ``coordinator-second-group``: an operator starts a coordinator of another group on the
  namespace (a mistyped ``--group-id``, an upgrade that renamed the group). It must refuse to
  start, naming the group that serves the namespace; one still running after ``hold`` seconds
  (it found no serving group, say while the group rebalanced) is stopped then: the namespace's
  transactional ids fence across groups, so nothing may be published twice either way.
- ``producer-kill``: SIGKILL an SDK producer in the middle of its transactions; start it again
  after ``hold`` (same instance id and database: it answers the back-checks of what it left
  in doubt). The producers are instances of one group, each on a database of its own: another
  instance must never answer for the killed one's transactions.

Faults fall in three lanes (nodes, coordinators, producers), each applied in order by a
thread of its own, so faults of different lanes overlap (a coordinator renamed while a node
is down) and faults of one lane never do. The node lane never has two nodes down: every node
fault starts and ends with every replica of the run's topics in sync (min ISR 2 of 3). A step
whose lane is still busy at its time starts late (its ``started`` says when).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from confluent_kafka.admin import AdminClient

from coordinator.service import REPLICATED_SESSION_TIMEOUT_MS
from servers.cluster import LocalCluster
from servers.coordinator_process import CoordinatorProcess, CoordinatorProcessError
from tests.secure.chaos import Producers, longest_gap, wait_in_sync, wait_serving

logger = logging.getLogger(__name__)

#: The coordinator's consumer session timeout on a cluster: a pause must outlast it.
SESSION_TIMEOUT_S = REPLICATED_SESSION_TIMEOUT_MS / 1000
#: Faults start this long after the load does, once transactions flow.
WARMUP_S = 10.0

# What a fault is expected to take, for spacing the steps of a lane (not a bound: a lane whose
# step runs longer starts its next one late). Seen on 2 cores running the three nodes, two
# coordinators and the producers (each the range over the first runs).
#: A node's start until it serves clients and every replica is in sync again (11-46 s).
NODE_BACK_S = 25.0
#: A node's controlled shutdown, SIGTERM until it exits (3-7 s).
NODE_STOP_S = 5.0
#: A coordinator's start until it is assigned partitions (4-8 s; 18-25 s while a node is down).
COORDINATOR_READY_S = 10.0
#: A coordinator's clean stop, SIGTERM until it exits (0.1-1 s; 20 s once, during a node's stop).
COORDINATOR_STOP_S = 3.0
#: A producer's start until it sends again.
PRODUCER_BACK_S = 3.0
#: A second group's coordinator: its start, the session timeout it waits out, then its refusal.
SECOND_GROUP_REFUSAL_S = SESSION_TIMEOUT_S + 3.0 + COORDINATOR_READY_S

#: Waiting longer than this for a node to stop or to be in sync, or for a coordinator to be
#: ready, fails the run: the cluster or the coordinator did not recover.
RECOVERY_TIMEOUT_S = 180.0


class Fault(StrEnum):
    NODE_KILL = "node-kill"
    ROLLING_RESTART = "rolling-restart"
    COORDINATOR_KILL = "coordinator-kill"
    COORDINATOR_PAUSE = "coordinator-pause"
    COORDINATOR_TERM = "coordinator-term"
    COORDINATOR_SECOND_GROUP = "coordinator-second-group"
    PRODUCER_KILL = "producer-kill"

    @property
    def lane(self) -> str:
        """The lane that applies it: "node", "coordinator" or "producer"."""
        prefix = self.value.split("-")[0]
        return prefix if prefix in ("coordinator", "producer") else "node"


LANES: dict[str, tuple[Fault, ...]] = {
    lane: tuple(f for f in Fault if f.lane == lane) for lane in ("node", "coordinator", "producer")
}


@dataclass(frozen=True)
class Step:
    """One fault of a schedule.

    Attributes:
        at: seconds after the load started.
        fault: what happens.
        target: a node id (the first node of a rolling restart), or a coordinator's or
            producer's index.
        hold: seconds the target stays down (stopped, for a pause) before it is started again.
        span: seconds the whole fault is expected to take, recovery included.
        renamed: a coordinator restarted as a new process under a new instance id.
    """

    at: float
    fault: Fault
    target: int
    hold: float
    span: float
    renamed: bool = False

    @property
    def until(self) -> float:
        """When the fault is expected to be over (seconds after the load started)."""
        return self.at + self.span

    @property
    def kind(self) -> str:
        """The fault, with ``renamed`` told apart: what a summary counts."""
        return f"{self.fault}(renamed)" if self.renamed else str(self.fault)

    def __str__(self) -> str:
        renamed = " under a new instance id" if self.renamed else ""
        return f"t+{self.at:.1f}s {self.fault} {self.fault.lane} {self.target}, {self.hold:.1f}s{renamed}"


@dataclass(frozen=True)
class Schedule:
    """The steps :func:`draw_schedule` drew for ``seed``, in time order."""

    seed: int
    seconds: float
    steps: tuple[Step, ...]

    def lane(self, name: str) -> list[Step]:
        return [s for s in self.steps if s.fault.lane == name]

    def counts(self) -> Counter[str]:
        return Counter(s.kind for s in self.steps)

    @property
    def replay(self) -> str:
        return f"TXBRIDGE_CHAOS_SEEDS={self.seed} TXBRIDGE_CHAOS_SECONDS={self.seconds:g}"


def draw_schedule(
    seed: int, seconds: float, *, nodes: Sequence[int], coordinators: int, producers: int
) -> Schedule:
    """Draw the faults of a run of ``seconds`` from ``random.Random(seed)`` alone.

    Each lane has each of its faults at least once, in a random order, then random ones of
    them while they fit; so do a coordinator restart under the same instance id and one under
    a new id. A lane's steps are spaced by their expected spans plus a random gap, and end by
    ``seconds``. A coordinator fault due shortly before a node fault is most often moved into
    that node's outage instead: a coordinator fails over while the cluster is short of a node.

    Raises:
        ValueError: ``seconds`` is too short for every fault.
    """
    rng = random.Random(seed)
    node_ids = sorted(nodes)

    def node_step(fault: Fault, at: float, _renamed: bool | None) -> Step:
        if fault is Fault.NODE_KILL:
            hold = rng.uniform(2.0, 6.0)
            return _step(at, fault, rng.choice(node_ids), hold, hold + NODE_BACK_S)
        hold = rng.uniform(0.5, 2.0)
        span = len(node_ids) * (NODE_STOP_S + hold + NODE_BACK_S)
        return _step(at, fault, rng.choice(node_ids), hold, span)

    def coordinator_step(fault: Fault, at: float, renamed: bool | None) -> Step:
        target = rng.randrange(coordinators)
        if fault is Fault.COORDINATOR_PAUSE:
            hold = rng.uniform(SESSION_TIMEOUT_S + 2.0, SESSION_TIMEOUT_S + 6.0)
            return _step(at, fault, target, hold, hold + COORDINATOR_READY_S)
        if fault is Fault.COORDINATOR_SECOND_GROUP:
            # Long enough for its refusal: it waits out a stopped member's session first.
            hold = rng.uniform(SECOND_GROUP_REFUSAL_S, SECOND_GROUP_REFUSAL_S + 8.0)
            return _step(at, fault, target, hold, hold + COORDINATOR_STOP_S)
        renamed = rng.random() < 0.5 if renamed is None else renamed
        hold = rng.uniform(0.1, 3.0)
        stop = COORDINATOR_STOP_S if fault is Fault.COORDINATOR_TERM else 0.0
        return _step(at, fault, target, hold, stop + hold + COORDINATOR_READY_S, renamed=renamed)

    def producer_step(fault: Fault, at: float, _renamed: bool | None) -> Step:
        hold = rng.uniform(0.5, 3.0)
        return _step(at, fault, rng.randrange(producers), hold, hold + PRODUCER_BACK_S)

    renamed = rng.random() < 0.5
    lanes = [
        (node_step, [(Fault.NODE_KILL, None), (Fault.ROLLING_RESTART, None)], (3.0, 10.0)),
        (
            coordinator_step,
            [
                (Fault.COORDINATOR_KILL, renamed),
                (Fault.COORDINATOR_PAUSE, None),
                (Fault.COORDINATOR_TERM, not renamed),
                (Fault.COORDINATOR_SECOND_GROUP, None),
            ],
            (3.0, 12.0),
        ),
        (producer_step, [(Fault.PRODUCER_KILL, None)], (5.0, 15.0)),
    ]
    steps: list[Step] = []
    for draw, required, gap in lanes:
        todo = rng.sample(required, len(required))
        kinds = [fault for fault, _ in required]
        at = WARMUP_S + rng.uniform(0.0, gap[1])
        aligned = draw is coordinator_step
        if aligned:
            at = _into_a_node_outage(rng, steps, WARMUP_S, at)
        while True:
            required_step = bool(todo)
            fault, renamed_or_none = todo.pop() if todo else (rng.choice(kinds), None)
            step = draw(fault, at, renamed_or_none)
            if step.until > seconds:
                if required_step:
                    raise ValueError(
                        f"{seconds:g}s is too short for every fault: {step} would end at {step.until:.0f}s"
                    )
                break
            steps.append(step)
            at = step.until + rng.uniform(*gap)
            if aligned:
                at = _into_a_node_outage(rng, steps, step.until, at)
    return Schedule(seed, seconds, tuple(sorted(steps, key=lambda s: s.at)))


#: A coordinator fault due this long before a node fault starts may be moved into its outage.
ALIGN_S = 20.0


def _into_a_node_outage(rng: random.Random, steps: Sequence[Step], earliest: float, at: float) -> float:
    """``at``, or (7 times in 10) a moment of the outage of the first node fault that starts
    between ``earliest`` and ``ALIGN_S`` after ``at``: while its node is stopping, down or
    starting again."""
    upcoming = [s for s in steps if s.fault.lane == "node" and earliest <= s.at <= at + ALIGN_S]
    if not upcoming or rng.random() >= 0.7:
        return at
    node_fault = min(upcoming, key=lambda s: s.at)
    return node_fault.at + rng.uniform(0.5, node_fault.hold + NODE_STOP_S + 5.0)


def _step(at: float, fault: Fault, target: int, hold: float, span: float, *, renamed: bool = False) -> Step:
    return Step(round(at, 1), fault, target, round(hold, 1), round(span, 1), renamed)


# ------------------------------------------------------------------ applying it


@dataclass(frozen=True)
class Applied:
    """A step as it happened: wall times of its start and end, and what it did."""

    step: Step
    started: float
    finished: float
    detail: str

    def stall(self, series: Sequence[Sequence[float]], tail: float, load_end: float) -> float | None:
        """The longest wait for a new message in any of ``series`` (first sightings, e.g. of each
        half partition: a coordinator stalls those it owns) from the fault's start to ``tail``
        seconds after its end (or to the load's end); None for a fault after the load."""
        if self.started >= load_end:
            return None
        end = min(self.finished + tail, load_end)
        return max(longest_gap(times, self.started, end) for times in series if times)


class Nemesis:
    """Applies a :class:`Schedule` to the cluster's nodes, the coordinators (supervised children:
    ``CoordinatorProcess(supervise=True)`` restarts one that exits on its own) and the producers.

    Args:
        schedule: the steps.
        cluster: the secured cluster.
        admin: an admin client of it, for the replicas' sync state.
        replicated: the topics whose replicas must be in sync between node faults.
        coordinators: the supervised coordinator processes, index for index with ``instance_ids``;
            the nemesis replaces one restarted under a new instance id (it keeps the list current).
        instance_ids: each coordinator's instance id.
        new_coordinator: makes a coordinator process (not started) with a given instance id.
        second_group: makes a coordinator process (not started, not supervised) of another
            group on the same namespace, with a given instance id.
        producers: the producer processes.
        describe_node: what a node is to the run (leaderships, coordinators it hosts), said in
            the detail of a node's fault.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        cluster: LocalCluster,
        admin: AdminClient,
        replicated: Sequence[str],
        coordinators: list[CoordinatorProcess],
        instance_ids: Sequence[str],
        new_coordinator: Callable[[str], CoordinatorProcess],
        second_group: Callable[[str], CoordinatorProcess],
        producers: Producers,
        describe_node: Callable[[int], str] = str,
    ) -> None:
        self.schedule = schedule
        self.cluster = cluster
        self.admin = admin
        self.replicated = list(replicated)
        self.coordinators = coordinators
        #: Each coordinator's current instance id.
        self.instance_ids = list(instance_ids)
        self.new_coordinator = new_coordinator
        self.second_group = second_group
        self.producers = producers
        self.describe_node = describe_node
        #: The steps applied so far.
        self.applied: list[Applied] = []
        #: Wall time the schedule's times count from.
        self.started = 0.0
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []
        self._stop = threading.Event()
        self._renames: Counter[int] = Counter()

    def start(self) -> None:
        """Start applying the schedule, its times counted from now."""
        self.started = time.time()
        steps = len(self.schedule.steps)
        logger.warning(
            "nemesis seed %d: %d steps; replay: %s", self.schedule.seed, steps, self.schedule.replay
        )
        for lane in LANES:
            thread = threading.Thread(target=self._run, args=(lane,), name=f"nemesis-{lane}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def join(self, timeout: float) -> list[Applied]:
        """Wait until every step is applied; re-raise a lane's failure.

        Raises:
            AssertionError: a lane is still busy after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._failures:
            raise self._failures[0]
        busy = [t.name for t in self._threads if t.is_alive()]
        assert not busy, f"{busy} still applying faults after {timeout:.0f}s"
        return sorted(self.applied, key=lambda a: a.started)

    def stop(self) -> None:
        """Apply no further step; wait for the current ones; start any node left down."""
        self._stop.set()
        for thread in self._threads:
            thread.join(RECOVERY_TIMEOUT_S)
        for node in self.cluster.node_ids:
            if node not in self.cluster.status().up:
                self.cluster.start_node(node)

    def _run(self, lane: str) -> None:
        try:
            for step in self.schedule.lane(lane):
                if self._stop.wait(max(0.0, self.started + step.at - time.time())):
                    return
                started = time.time()
                logger.warning("nemesis seed %d: %s (%+.1fs late)", self.schedule.seed, step,
                               started - self.started - step.at)  # fmt: skip
                detail = self._apply(step)
                self.applied.append(Applied(step, started, time.time(), detail))
                logger.warning("nemesis seed %d: %s: %s", self.schedule.seed, step.fault, detail)
        except BaseException as exc:  # join() re-raises it in the test's thread
            logger.exception("nemesis seed %d: the %s lane failed", self.schedule.seed, lane)
            self._failures.append(exc)

    def _apply(self, step: Step) -> str:
        apply = {
            Fault.NODE_KILL: self._node_kill,
            Fault.ROLLING_RESTART: self._rolling_restart,
            Fault.COORDINATOR_KILL: self._coordinator_restart,
            Fault.COORDINATOR_TERM: self._coordinator_restart,
            Fault.COORDINATOR_PAUSE: self._coordinator_pause,
            Fault.COORDINATOR_SECOND_GROUP: self._second_group,
            Fault.PRODUCER_KILL: self._producer_kill,
        }[step.fault]
        return apply(step)

    # ---------------------------------------------------------------- nodes

    def _in_sync(self) -> float:
        return wait_in_sync(self.admin, self.replicated, RECOVERY_TIMEOUT_S)

    def _node_kill(self, step: Step) -> str:
        self._in_sync()
        roles = self.describe_node(step.target)
        assert self.cluster.kill_node(step.target), f"node {step.target} was not running"
        killed = time.monotonic()
        try:
            time.sleep(step.hold)
        finally:
            self.cluster.start_node(step.target)
        wait_serving(self.cluster, step.target, RECOVERY_TIMEOUT_S)
        back = time.monotonic() - killed
        return f"node {step.target} ({roles}) back in {back:.1f}s, in sync {self._in_sync():.1f}s later"

    def _rolling_restart(self, step: Step) -> str:
        nodes = self.cluster.node_ids
        first = nodes.index(step.target)
        said = []
        for node in nodes[first:] + nodes[:first]:
            self._in_sync()
            roles = self.describe_node(node)
            stopped = terminate_node(self.cluster, node, RECOVERY_TIMEOUT_S)
            started = time.monotonic()
            try:
                time.sleep(step.hold)
            finally:
                self.cluster.start_node(node)
            wait_serving(self.cluster, node, RECOVERY_TIMEOUT_S)
            back = time.monotonic() - started
            in_sync = self._in_sync()
            said.append(
                f"{node} ({roles}): stopped in {stopped:.1f}s, back in {back:.1f}s, in sync {in_sync:.1f}s"
            )
        return "; ".join(said)

    # ---------------------------------------------------------------- coordinators

    def _successor(self, index: int, old: CoordinatorProcess, renamed: bool) -> CoordinatorProcess:
        if not renamed:
            return old
        self._renames[index] += 1
        instance = f"{self.instance_ids[index].split('-r')[0]}-r{self._renames[index]}"
        self.instance_ids[index] = instance
        old.stop()  # already ended: this ends its supervision
        new = self.new_coordinator(instance)
        self.coordinators[index] = new
        return new

    def _coordinator_restart(self, step: Step) -> str:
        """SIGKILL or SIGTERM, then the same instance id or a new one."""
        before = self.instance_ids[step.target]
        # What kill() and stop() end, the supervision does not start again; start() resumes it.
        old = self.coordinators[step.target]
        ended = time.monotonic()
        if step.fault is Fault.COORDINATOR_KILL:
            old.kill()
            how = "SIGKILL"
        else:
            code = old.stop(timeout=60)
            how = f"SIGTERM: exit {code} in {time.monotonic() - ended:.1f}s"
        time.sleep(step.hold)
        new = self._successor(step.target, old, step.renamed)
        new.start()
        return f"{before} {how}; {self.instance_ids[step.target]} {self._ready(new, ended)}"

    def _coordinator_pause(self, step: Step) -> str:
        coordinator = self.coordinators[step.target]
        pid = coordinator.pause()
        if pid is None:
            return f"{self.instance_ids[step.target]} not running: not paused"
        try:
            time.sleep(step.hold)
        finally:
            coordinator.resume()
        time.sleep(1.0)  # a zombie that learns it was fenced may exit now (its supervision restarts it)
        alive = "still running" if coordinator.alive() and coordinator.pid == pid else "exited after SIGCONT"
        return f"{self.instance_ids[step.target]} (pid {pid}) SIGSTOP for {step.hold:.1f}s, SIGCONT: {alive}"

    def _second_group(self, step: Step) -> str:
        intruder = self.second_group(f"second-{len(self.applied)}")
        started = time.monotonic()
        intruder.start()
        while intruder.alive() and time.monotonic() - started < step.hold:
            time.sleep(0.5)
        if intruder.alive():
            intruder.stop(timeout=60)
            return f"another group's coordinator ran {step.hold:.0f}s without refusing; stopped"
        refusal = [
            line for line in intruder.log_tail(40).splitlines() if "is served by coordinator group" in line
        ]
        said = (
            refusal[-1][refusal[-1].index("namespace") :][:160]
            if refusal
            else "exited without the refusal: " + intruder.log_tail(3)
        )
        return f"another group's coordinator exited after {time.monotonic() - started:.1f}s: {said}"

    def _ready(self, coordinator: CoordinatorProcess, since: float) -> str:
        try:
            coordinator.wait_ready(RECOVERY_TIMEOUT_S)
        except CoordinatorProcessError as exc:
            if coordinator.alive():  # not assigned in time: the coordinator did not recover
                raise
            return f"exited before it was ready ({exc}); its supervision starts it again"
        return f"ready {time.monotonic() - since:.1f}s after the stop"

    # ---------------------------------------------------------------- producers

    def _producer_kill(self, step: Step) -> str:
        self.producers.kill(step.target)
        try:
            time.sleep(step.hold)
        finally:
            self.producers.restart(step.target)
        return f"producer {step.target} SIGKILLed, started again after {step.hold:.1f}s"


def terminate_node(cluster: LocalCluster, node: int, timeout: float) -> float:
    """SIGTERM node ``node`` (Kafka's controlled shutdown) and wait until it exits; SIGKILL it
    after ``timeout``. Returns how long it took."""
    started = time.monotonic()
    pid = next(n.pid for n in cluster.status().nodes if n.node_id == node)
    assert pid is not None, f"node {node} is not running"
    os.kill(pid, signal.SIGTERM)
    while node in cluster.status().up:
        if time.monotonic() - started > timeout:
            logger.warning("node %d ignored SIGTERM for %.0fs: killing it", node, timeout)
            cluster.kill_node(node)
            break
        time.sleep(0.2)
    return time.monotonic() - started
