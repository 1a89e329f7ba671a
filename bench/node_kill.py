"""The nodekill step: Kafka nodes SIGKILLed under txbridge and under native Kafka transactions.

The step starts a secured 3-node cluster of its own (:class:`LocalCluster` in a temp folder of
the run's, whatever ``--bootstrap`` says: the rest of the bench runs on one node) and runs two
steady loads on it at once, at the same rate, one message per transaction
(:mod:`bench.steady_load`): txbridge (the SDK producer, two coordinator processes
republishing to a real topic) and native Kafka transactions (one transactional producer: begin,
produce, commit, on a real topic of its own placed as txbridge's). A read_committed watcher of
each real topic times when each message is first visible. Then two kills, each node started
again :attr:`NodeKillOptions.down_s` later:

1. the node leading every half and op partition (the namespace's half and op topics are created
   with it as every partition's preferred leader);
2. once that node serves again, every replica is in sync and every leader is back on its
   preferred replica, the node that is the transaction coordinator (the ``__transaction_state``
   leader) of most of the coordinators' transactional ids; the native producer's transactional
   id is picked so that its transaction coordinator is that node too.

A coordinator's transactional id is its incarnation's, with a random part, so where it hashes
is known only once the coordinators run: their claim records in ``<ns>_state`` name the ids.
The step then picks the node coordinating most of them, another than the half and op leader
when it can, and the native producer's id on that node; at the second kill it reads the ids
again (a coordinator restarted or fenced by the first kill commits under a new one). Each
kill's ``roles`` in the figure's params say what the node was to the run.

The figures, per path, overall and per kill:

- ``stall s``: the worst commit-to-visible time of the messages the application committed from
  :data:`KILL_LEAD_S` before the kill on, counted from the application's commit: when the local
  transaction returned COMMIT (txbridge), when ``commit_transaction`` was called (native). That is
  what a user waits between committing and a consumer seeing the message, whichever path
  blocked: native's commit blocks in ``commit_transaction`` while a partition or its
  transaction coordinator has no leader, txbridge's in the op's write or in the coordinator's
  republish.
- ``stall after ack s``: the same from when that commit was acknowledged (the SDK reported
  COMMIT, ``commit_transaction`` returned), which leaves out the time a commit itself blocked.
- the committed messages never seen (lost) and seen more than once (duplicated) when each real
  topic is read again to its end, and the longest gap between new messages on each real topic
  after the first kill.

In full mode the step then measures the standby takeover on the same cluster, every node
serving again: the ``failover`` step's two kills (:func:`bench.txbridge_runs.failovers`), whose
figures carry ``brokers`` = 3 and so answer the cluster's takeover goal (13 s: the group session
is 12 s on a cluster, coordinator/group/consumer.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import txbridge_runs as tb
from bench.kafka_native import BenchError, Figure, payload
from bench.results_table import ON_CLUSTER
from bench.scaleout import longest_gap
from bench.steady_load import Load, NativeLoad, TxbridgeLoad
from coordinator.commit import changelog
from servers import placement
from servers.cluster import LocalCluster
from servers.coordinator_process import CoordinatorProcess
from txbridge import kafka
from txbridge.client_config import ClientConfig
from txbridge.errors import TxBridgeError
from txbridge.topics import internal_topics
from txbridge.wire import H_TX, Topics, default_coordinator_group, header_dict

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]

#: Half (and op) partitions of the step's namespace: as many coordinator transactional ids.
HALF_PARTITIONS = 6
#: Partitions of each real topic: one led by each node.
TOPIC_PARTITIONS = 3
LEADER_KILL = "leader kill"
TXN_COORDINATOR_KILL = "txn coordinator kill"
PATHS = ("txbridge", "native")
#: A kill's window opens this long before it: a message committed just before the SIGKILL whose
#: commit or republish the dead node holds is the kill's stall, not the load's.
KILL_LEAD_S = 1.0


@dataclass(frozen=True)
class NodeKillOptions:
    """How long and how fast the step runs.

    Attributes:
        rate: transactions per second of each path (one message each).
        warmup_s: load before the first kill.
        after_s: load after each killed node is back.
        down_s: how long a killed node stays down.
        settle_s: how long, at most, the watchers wait for the last committed messages.
        failover: then the standby takeover on the same cluster (the ``failover`` step's figures).
    """

    rate: float
    warmup_s: float
    after_s: float
    down_s: float = 3.0
    settle_s: float = 60.0
    failover: bool = False


OPTIONS = {
    "quick": NodeKillOptions(rate=20.0, warmup_s=3.0, after_s=6.0),
    # The takeover adds about two minutes; CI's quick run leaves it out.
    "full": NodeKillOptions(rate=50.0, warmup_s=5.0, after_s=10.0, settle_s=90.0, failover=True),
}


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: what the node was to the run then, when, and when it was back."""

    what: str
    node: int
    at: float
    back_s: float
    roles: dict[str, int]


@dataclass(frozen=True)
class PathTimes:
    """One path's messages by id: when the application committed each, when that commit was
    acknowledged, when each was first visible, and how many times it is on its real topic."""

    decided: Mapping[str, float]
    committed: Mapping[str, float]
    seen: Mapping[str, float]
    copies: Mapping[str, int]


def stall(
    committed: Mapping[str, float], seen: Mapping[str, float], start: float, end: float, watched_until: float
) -> float:
    """The longest commit-to-visible time of the messages committed in ``[start, end)``.

    A message never seen counts until ``watched_until`` (when the reader stopped looking): a
    consumer waited at least that long for it.
    """
    return max(
        (seen.get(tx, watched_until) - at for tx, at in committed.items() if start <= at < end),
        default=0.0,
    )


def lost_and_duplicated(committed: Iterable[str], copies: Mapping[str, int]) -> tuple[int, int]:
    """How many committed messages are not on the topic, and how many are on it more than once."""
    committed = list(committed)
    return (
        sum(1 for tx in committed if copies.get(tx, 0) == 0),
        sum(1 for tx in committed if copies.get(tx, 0) > 1),
    )


def figure_values(
    paths: Mapping[str, PathTimes], kills: Sequence[Kill], watched_until: float
) -> dict[str, float]:
    """The figure's values: each path's stall from the first kill on (from the application's
    commit, then from its acknowledgement), their difference, each kill's stalls, the lost and
    duplicated counts and the longest gaps."""
    starts = [k.at - KILL_LEAD_S for k in kills]
    ends = [*starts[1:], math.inf]
    out: dict[str, float] = {}
    for name, p in paths.items():
        out[f"{name} stall s"] = stall(p.decided, p.seen, starts[0], math.inf, watched_until)
    out["txbridge - native s"] = out["txbridge stall s"] - out["native stall s"]
    for name, p in paths.items():
        out[f"{name} stall after ack s"] = stall(p.committed, p.seen, starts[0], math.inf, watched_until)
    for kill, start, end in zip(kills, starts, ends, strict=True):
        for name, p in paths.items():
            out[f"{name} stall s ({kill.what})"] = stall(p.decided, p.seen, start, end, watched_until)
            out[f"{name} stall after ack s ({kill.what})"] = stall(
                p.committed, p.seen, start, end, watched_until
            )
    for name, p in paths.items():
        lost, duplicated = lost_and_duplicated(p.committed, p.copies)
        out[f"{name} lost"] = float(lost)
        out[f"{name} duplicated"] = float(duplicated)
    for name, p in paths.items():
        out[f"{name} longest gap s"] = longest_gap(p.seen.values(), kills[0].at, watched_until)
    for name, p in paths.items():
        out[f"{name} committed"] = float(len(p.committed))
    return out


# ------------------------------------------------------------------ the cluster and where things are


@dataclass(frozen=True)
class _Layout:
    """Where the step put things: the namespace, the node leading its half and op partitions,
    and once the coordinators run (:func:`_place_transactions`) the node that is the transaction
    coordinator of most of their transactional ids and of the native producer's."""

    namespace: str
    group: str
    half_op_leader: int
    txn_node: int = -1
    native_id: str = ""


def _start_cluster(cluster: LocalCluster, progress: Progress) -> None:
    progress(f"starting a secured 3-node Kafka cluster in {cluster.home} ...")
    started = time.monotonic()
    try:
        cluster.start()
    except TxBridgeError as exc:
        raise BenchError(f"nodekill needs the secured 3-node cluster, which did not start: {exc}") from exc
    progress(f"cluster up at {cluster.bootstrap} in {time.monotonic() - started:.0f}s")


def _stop_cluster(cluster: LocalCluster) -> None:
    cluster.stop(timeout=15)
    for node_id in cluster.node_ids:  # the data; the logs stay with the run's
        shutil.rmtree(cluster.home / f"node-{node_id}" / "data", ignore_errors=True)


def _coordinator_ids(env: tb.Env, namespace: str) -> list[str]:
    """The transactional ids the namespace's coordinators commit under now: those their claim
    records in ``<ns>_state`` name."""
    owners = changelog.read_owners(
        env.bootstrap, Topics(namespace).state, list(range(HALF_PARTITIONS)), env.extra, 60.0
    )
    return sorted({owner for reads in owners.values() for owner in changelog.claimants(reads)})


def _pick_layout(admin: Any, prefix: str, node_ids: Sequence[int]) -> tuple[str, int]:
    """A namespace and the node to lead its half and op partitions: not its coordinators'
    group coordinator (a third role the kill would add)."""
    offsets = placement.leaders(admin, placement.OFFSETS_TOPIC)
    namespace = f"{prefix}0"
    group_node = offsets[placement.partition_for(default_coordinator_group(namespace), len(offsets))]
    return namespace, next((n for n in node_ids if n != group_node), node_ids[0])


def _place_transactions(env: tb.Env, admin: Any, layout: _Layout, progress: Progress) -> _Layout:
    """``layout`` with the node to kill as the transaction coordinator, read once the
    coordinators run: the one coordinating most of their ids, the half and op leader only if it
    coordinates all of them; and the native producer's id on that node."""
    hosts = placement.transaction_coordinators(admin, _coordinator_ids(env, layout.namespace))
    if not hosts:
        raise BenchError(f"no claim record names a coordinator of {layout.namespace}")
    others = Counter({n: c for n, c in hosts.items() if n != layout.half_op_leader})
    txn_node = (others or hosts).most_common(1)[0][0]
    native_id = _native_id(admin, f"bench-nodekill-native-{env.run_id}-", txn_node)
    progress(
        f"node {txn_node} is the transaction coordinator of {hosts[txn_node]}/{sum(hosts.values())} "
        f"of the coordinators' transactional ids and of the native producer's ({native_id})"
    )
    return replace(layout, txn_node=txn_node, native_id=native_id)


def _native_id(admin: Any, prefix: str, node: int) -> str:
    """A transactional id whose transaction coordinator is ``node``."""
    log = placement.leaders(admin, placement.TRANSACTION_LOG)
    names = (f"{prefix}{k}" for k in itertools.count())
    return next(name for name in names if log[placement.partition_for(name, len(log))] == node)


def _lay_out(env: tb.Env, cluster: LocalCluster, admin: Any, topics: Sequence[str]) -> _Layout:
    """Create the namespace and the real ``topics`` where the kills will hit them."""
    placement.ensure_internal_topics(env.bootstrap, env.extra)
    placement.wait_in_sync(admin, timeout=120)
    placement.elect_preferred_leaders(admin)
    namespace, leader = _pick_layout(admin, f"__txb_nodekill_{env.run_id}_", cluster.node_ids)
    group = default_coordinator_group(namespace)
    names = Topics(namespace)
    led = placement.led_by(leader, cluster.node_ids, HALF_PARTITIONS)
    spread = placement.round_robin(cluster.node_ids, TOPIC_PARTITIONS)
    specs = [
        *internal_topics(namespace, HALF_PARTITIONS, 3),
        *(kafka.TopicSpec(t, TOPIC_PARTITIONS, replication_factor=3) for t in topics),
    ]
    assignments = {names.half: led, names.op: led, **dict.fromkeys(topics, spread)}
    placement.create_topics(env.bootstrap, specs, assignments, extra=env.extra)
    return _Layout(namespace, group, leader)


def _roles(env: tb.Env, admin: Any, node: int, layout: _Layout, topic: str) -> dict[str, int]:
    """What ``node`` is to the run right now."""
    half = placement.leaders(admin, Topics(layout.namespace).half)
    ids = _coordinator_ids(env, layout.namespace)
    return {
        "half partitions led": sum(n == node for n in half.values()),
        "real topic partitions led": sum(n == node for n in placement.leaders(admin, topic).values()),
        "coordinator transactional ids": placement.transaction_coordinators(admin, ids)[node],
        "native transactional id": int(
            placement.coordinator_node(admin, placement.TRANSACTION_LOG, layout.native_id) == node
        ),
        "coordinators' group coordinator": int(
            placement.coordinator_node(admin, placement.OFFSETS_TOPIC, layout.group) == node
        ),
    }


def _kill(
    cluster: LocalCluster, node: int, *, what: str, roles: dict[str, int], down_s: float, progress: Progress
) -> Kill:
    said = ", ".join(f"{k}: {v}" for k, v in roles.items())
    progress(f"SIGKILL node {node} ({what}; {said})")
    at = time.time()
    cluster.kill_node(node)
    time.sleep(down_s)
    try:
        cluster.start_node(node)
    except TxBridgeError as exc:
        raise BenchError(f"node {node} did not come back after its SIGKILL: {exc}") from exc
    back_s = time.time() - at
    progress(f"node {node} back {back_s:.1f}s after its SIGKILL")
    return Kill(what, node, at, back_s, roles)


def _under_load(loads: Sequence[Load], seconds: float) -> None:
    """Let the loads run ``seconds``; raises as soon as one fails."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        for load in loads:
            load.check()


def _wait_seen(watchers: Mapping[str, tb.Watcher], loads: Mapping[str, Load], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(all(tx in watchers[n].seen for tx in loads[n].committed) for n in PATHS):
            return
        time.sleep(0.2)


def _copies(env: tb.Env, topic: str, timeout: float = 60.0) -> Counter[str]:
    """How many times each message id is on ``topic``, read_committed from its start to its end."""
    consumer = kafka.consumer(
        env.bootstrap, f"bench-nodekill-count-{uuid.uuid4().hex[:8]}", env.extra, enable_partition_eof=True
    )
    copies: Counter[str] = Counter()
    try:
        consumer.assign([kafka.partition_at(topic, p, kafka.FROM_START) for p in range(TOPIC_PARTITIONS)])
        ends: dict[int, int | None] = dict.fromkeys(range(TOPIC_PARTITIONS))
        for msg in kafka.read_to_end(consumer, topic, ends, timeout=timeout, what=f"reading {topic}"):
            headers: Any = msg.headers()
            tx = header_dict(headers).get(H_TX)
            if tx:
                copies[tx.decode()] += 1
    except TxBridgeError as exc:
        raise BenchError(f"nodekill: could not count the messages on {topic}: {exc}") from exc
    finally:
        consumer.close()
    return copies


# ------------------------------------------------------------------ the step


@dataclass(frozen=True)
class _Setup:
    """The running cluster and what the step laid out on it."""

    folder: Path
    cluster: LocalCluster
    env: tb.Env
    admin: Any
    topics: dict[str, str]
    layout: _Layout


def run(options: NodeKillOptions, work: Path, *, size: int, progress: Progress = logger.info) -> list[Figure]:
    """The nodekill step (see the module's docstring), in a folder of its own under ``work``:
    the node kill's figure, then the cluster's takeovers if ``options.failover``.

    Raises:
        BenchError: the cluster did not start, a node did not come back, a load failed.
        CoordinatorProcessError: a coordinator did not get ready.
    """
    with ExitStack() as stack:
        setup = _set_up(Path(tempfile.mkdtemp(prefix="nodekill-", dir=work)), stack, progress)
        coordinators = _start_coordinators(setup.env, setup.layout.namespace, setup.folder, stack, progress)
        setup = replace(setup, layout=_place_transactions(setup.env, setup.admin, setup.layout, progress))
        watchers, loads = _start_loads(setup, options, size, stack)
        progress(f"{options.rate:.0f} transactions/s through txbridge and through native transactions ...")
        started = time.time()
        kills = _kill_twice(
            setup.env,
            setup.cluster,
            setup.admin,
            setup.layout,
            topic=setup.topics["txbridge"],
            loads=list(loads.values()),
            options=options,
            progress=progress,
        )
        for load in loads.values():
            load.stop()
        loaded_s = time.time() - started
        progress("load stopped; waiting for the last committed messages to be visible ...")
        _wait_seen(watchers, loads, options.settle_s)
        watched_until = time.time()
        paths = _path_times(setup, watchers, loads)
        params = _params(
            options, size=size, kills=kills, coordinators=coordinators, loads=loads, folder=setup.folder
        )
        committed = sum(len(p.committed) for p in paths.values())
        figure = Figure("node kill", committed, loaded_s, figure_values(paths, kills, watched_until), params)
        _say_figure(figure, progress)
        takeovers = _takeovers(setup.env, size, progress) if options.failover else []
    return [figure, *takeovers]


def _takeovers(env: tb.Env, size: int, progress: Progress) -> list[Figure]:
    """The standby takeover on the cluster: a coordinator SIGKILLed at a random moment, then one
    inside its Kafka transaction (the ``failover`` step, on this cluster)."""
    progress("standby takeover on the cluster: a coordinator SIGKILLed under load, twice ...")
    figures = [replace(f, name=f"{f.name}{ON_CLUSTER}") for f in tb.failovers(env, size=size)]
    for figure in figures:
        seconds = figure.values["seconds_to_first_republish"]
        progress(f"{figure.name}: {seconds:.2f}s from the kill to the first republish")
    return figures


def _set_up(folder: Path, stack: ExitStack, progress: Progress) -> _Setup:
    """Start the cluster in ``folder`` (stopped when ``stack`` closes) and lay out the namespace
    and the real topics on it."""
    cluster = LocalCluster(folder / "kafka-cluster")
    _start_cluster(cluster, progress)
    stack.callback(_stop_cluster, cluster)
    env = tb.Env(
        cluster.bootstrap, uuid.uuid4().hex[:8], folder, client=ClientConfig.load(cluster.properties_file)
    )
    admin = kafka.admin(env.bootstrap, env.extra)
    topics = {name: f"bench-nodekill-{env.run_id}-{name}" for name in PATHS}
    layout = _lay_out(env, cluster, admin, list(topics.values()))
    progress(f"namespace {layout.namespace}: node {layout.half_op_leader} leads its half and op partitions")
    return _Setup(folder, cluster, env, admin, topics, layout)


def _start_loads(
    setup: _Setup, options: NodeKillOptions, size: int, stack: ExitStack
) -> tuple[dict[str, tb.Watcher], dict[str, Load]]:
    """A watcher of each real topic, then each path's load, all closed when ``stack`` closes."""
    env, layout, topics = setup.env, setup.layout, setup.topics
    watchers = {name: tb.Watcher(env.bootstrap, topics[name], env.extra) for name in PATHS}
    for watcher in watchers.values():
        stack.callback(watcher.close)
        watcher.start()
    value = payload(size)
    loads: dict[str, Load] = {
        "txbridge": TxbridgeLoad(
            env, layout.namespace, topics["txbridge"], value, options.rate, partitions=HALF_PARTITIONS
        ),
        "native": NativeLoad(env, layout.native_id, topics["native"], value, options.rate),
    }
    for load in loads.values():
        stack.callback(load.halt)
        load.start()
    return watchers, loads


def _path_times(
    setup: _Setup, watchers: Mapping[str, tb.Watcher], loads: Mapping[str, Load]
) -> dict[str, PathTimes]:
    return {
        name: PathTimes(
            loads[name].decided,
            loads[name].committed,
            dict(watchers[name].seen),
            _copies(setup.env, setup.topics[name]),
        )
        for name in PATHS
    }


def _params(
    options: NodeKillOptions,
    *,
    size: int,
    kills: Sequence[Kill],
    coordinators: Sequence[CoordinatorProcess],
    loads: Mapping[str, Load],
    folder: Path,
) -> dict[str, Any]:
    return {
        "rate": options.rate,
        "size": size,
        "warmup_s": options.warmup_s,
        "down_s": options.down_s,
        "after_s": options.after_s,
        "cluster": "3 KRaft nodes, SASL_SSL, replication factor 3, min.insync.replicas 2",
        "half_partitions": HALF_PARTITIONS,
        "topic_partitions": TOPIC_PARTITIONS,
        "kills": [
            {
                "what": k.what,
                "node": k.node,
                "at": datetime.fromtimestamp(k.at, UTC).isoformat(timespec="milliseconds"),
                "back_s": round(k.back_s, 1),
                "roles": k.roles,
            }
            for k in kills
        ],
        "coordinator_exits": sum(len(c.exits) for c in coordinators),
        "coordinator_sessions_lost": sum(_sessions_lost(c.log_path) for c in coordinators),
        "outcomes": {name: dict(loads[name].outcomes) for name in PATHS},
        "logs": str(folder),
    }


def _say_figure(figure: Figure, progress: Progress) -> None:
    v, params = figure.values, figure.params
    progress(
        f"stall from the application's commit: txbridge {v['txbridge stall s']:.1f}s, "
        f"native {v['native stall s']:.1f}s (after the commit's ack: "
        f"{v['txbridge stall after ack s']:.1f}s, {v['native stall after ack s']:.1f}s); "
        f"lost {v['txbridge lost']:.0f}/{v['native lost']:.0f}, "
        f"duplicated {v['txbridge duplicated']:.0f}/{v['native duplicated']:.0f} (txbridge/native); "
        f"coordinator sessions lost: {params['coordinator_sessions_lost']}"
    )


def _kill_twice(
    env: tb.Env,
    cluster: LocalCluster,
    admin: Any,
    layout: _Layout,
    *,
    topic: str,
    loads: Sequence[Load],
    options: NodeKillOptions,
    progress: Progress,
) -> list[Kill]:
    """Under the loads: kill the half/op leader; once all is well again, the transaction
    coordinator; each followed by :attr:`NodeKillOptions.after_s` of load."""
    _under_load(loads, options.warmup_s)
    roles = _roles(env, admin, layout.half_op_leader, layout, topic)
    kills = [
        _kill(
            cluster,
            layout.half_op_leader,
            what=LEADER_KILL,
            roles=roles,
            down_s=options.down_s,
            progress=progress,
        )
    ]
    _under_load(loads, options.after_s)
    in_sync_s = placement.wait_in_sync(admin, timeout=180)
    elsewhere = placement.elect_preferred_leaders(admin)
    if elsewhere:
        logger.warning("partitions not back on their preferred leader: %s", elsewhere[:10])
    progress(f"every replica in sync {in_sync_s:.1f}s later, leaders back on their preferred replicas")
    # The node coordinating most of the coordinators' transactional ids now (a coordinator the
    # first kill restarted or fenced commits under a new id): the planned one unless they moved.
    hosts = placement.transaction_coordinators(admin, _coordinator_ids(env, layout.namespace))
    txn_node = (
        layout.txn_node
        if not hosts or hosts[layout.txn_node] == max(hosts.values())
        else hosts.most_common(1)[0][0]
    )
    roles = _roles(env, admin, txn_node, layout, topic)
    if not roles["native transactional id"]:
        logger.warning("the native producer's transaction coordinator is not node %d", txn_node)
    kills.append(
        _kill(
            cluster,
            txn_node,
            what=TXN_COORDINATOR_KILL,
            roles=roles,
            down_s=options.down_s,
            progress=progress,
        )
    )
    _under_load(loads, options.after_s)
    return kills


def _sessions_lost(log: Path) -> int:
    """How many times a coordinator's group session expired (its partitions dropped uncommitted):
    on a cluster, a session shorter than a dead node's fencing window expires at each kill."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0
    return text.count("partitions lost (session timeout)")


def _start_coordinators(
    env: tb.Env, namespace: str, folder: Path, stack: ExitStack, progress: Progress
) -> list[CoordinatorProcess]:
    """Two coordinator processes, restarted when they exit on their own (as a supervisor does)."""
    args = (
        "--log-interval",
        "5",
        # Back-checks soon: a transaction whose op record was lost to a kill is settled by one.
        *("--check-delay", "2", "--check-backoff", "1", "--check-backoff-max", "2"),
        *env.client.cli_args(),
    )
    coordinators = [
        CoordinatorProcess(
            env.bootstrap,
            namespace,
            secret=env.secret,
            log_path=folder / f"coordinator-{name}.log",
            args=args,
            instance_id=f"nodekill-{name}",
            supervise=True,
        )
        for name in ("a", "b")
    ]
    first, second = coordinators
    stack.callback(first.stop)
    first.start().wait_ready(90)
    stack.callback(second.stop)
    second.start().wait_ready(90)
    first.wait_ready(60, marks=2)  # the rebalance gave `first` its share again
    progress(f"two coordinators ready (logs {folder}/coordinator-*.log)")
    return coordinators
