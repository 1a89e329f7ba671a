"""The nemesis on the secured 3-node cluster: nodes, coordinators and producers fail at random
under load, and a reader on another client sees every committed transaction once, nothing
rolled back, each key in order.

SDK producer processes (``chaos_producer.py``, a SqliteBarrier each) send keyed transactions
through two coordinator processes while :mod:`tests.secure.nemesis` applies the schedule it
drew from the seed: node SIGKILLs, a rolling restart of every node, coordinator SIGKILLs and
SIGTERMs (started again under the same or a new instance id), a coordinator SIGSTOPped past
its session timeout then SIGCONTed, producer SIGKILLs. A coordinator that exits on its own is
started again by its supervision (``CoordinatorProcess(supervise=True)``), under its current
instance id.

Afterwards (bounded wait) kafka-python, not librdkafka, reads the real topic read_committed:
every transaction the barrier holds as committed (the SDK reported COMMIT, an UNKNOWN settled
COMMIT, or a killed producer's transaction committed locally) must be there exactly once,
nothing of any other transaction (a phantom), and each key's transactions in their seq order.
A librdkafka consumer reading during the run gives each fault's publishing stall: the longest
wait for a new message of one half partition (the unit a coordinator owns) from the fault's
start to ``STALL_TAIL_S`` after its end.

Environment:
    TXBRIDGE_CHAOS_SEEDS: comma-separated seeds, one run each (default 20261133, a schedule
        with a coordinator renamed while a node is SIGKILLed, and others during the rolling
        restart).
    TXBRIDGE_CHAOS_SECONDS: the schedule's length (default 180, times ``TXBRIDGE_SOAK_SCALE``;
        below 180 not every fault fits). The load, about 4 transactions per second, lasts until
        the last fault is over and ``STALL_TAIL_S`` more, however slowly the faults go (nodes
        restart 3 times slower on 2 cores shared with another cluster): about 750 transactions
        at 160 s on 2 cores of its own.
    TXBRIDGE_CHAOS_SUMMARY: a file each run appends its summary line to (``make chaos``).

On 2 cores that also run the three nodes, a run takes the schedule's length plus about a minute.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from servers.coordinator_process import CoordinatorProcess
from tests.kafka_helpers import delete_namespaces
from tests.secure.chaos import (
    OFFSETS_TOPIC,
    STALL_DUMP_S,
    TRANSACTION_LOG,
    Figures,
    Producers,
    Supervised,
    Watcher,
    ensure_transaction_log,
    op_batches,
    read_committed_elsewhere,
    roles,
    supervised,
    tally,
    transactional_ids,
    wait_in_sync,
    wait_until,
)
from tests.secure.chaos_producer import key_of
from tests.secure.conftest import SecureKafka, read_committed
from tests.secure.nemesis import Applied, Nemesis, draw_schedule
from txbridge import kafka
from txbridge.topics import internal_topics
from txbridge.wire import Topics, half_partition

SCALE = float(os.environ.get("TXBRIDGE_SOAK_SCALE", "1.0"))
SEEDS = [int(s) for s in os.environ.get("TXBRIDGE_CHAOS_SEEDS", "20261133").split(",") if s.strip()]
SECONDS = float(os.environ.get("TXBRIDGE_CHAOS_SECONDS", str(180 * SCALE)))
SUMMARY = os.environ.get("TXBRIDGE_CHAOS_SUMMARY")

PRODUCERS = 2
THREADS = 3
#: 4.2 transactions per second in all.
RATE_PER_THREAD = 0.7
#: Each local transaction works this long (before and after its commit): a producer killed at
#: a random moment finds one of its threads' transactions in flight about half the time.
WORK_MS = 600
COORDINATORS = 2
PARTITIONS = 6
#: A fault's stall is measured until this long after it ended (a node in sync, a coordinator
#: assigned partitions), for the publishing that resumes later.
STALL_TAIL_S = 20.0
#: The bound on each fault's publishing stall. Generous on purpose: a node SIGKILL alone stalls
#: 10 to 20 s (its leaders' election, the transaction coordinator moving, the coordinators'
#: producers retrying; test_broker_chaos.py), a renamed coordinator restart or a pause 6 to 12 s
#: (the session timeout, then the new owner's fence), and faults of different lanes overlap,
#: on 2 cores that also run the three nodes. A stall past it means a coordinator sat on work
#: it could have published: a hang, not slowness.
STALL_BOUND_S = 60.0
#: At the end, nothing new for this long means nothing more is coming.
QUIET_S = 45.0
SECRET = "nemesis-secret"  # noqa: S105 - a test-only HMAC secret

pytestmark = [
    pytest.mark.integration,
    pytest.mark.cluster,
    pytest.mark.soak,
    pytest.mark.timeout(int(SECONDS * 6 + 900)),
]


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as resources:
        yield resources


@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_lose_duplicate_resurrect_and_reorder_nothing(
    seed: int,
    secure_kafka: SecureKafka,
    secure_topic: Callable[..., str],
    tmp_path: Path,
    stack: ExitStack,
) -> None:
    started = time.monotonic()
    cluster = secure_kafka.cluster
    schedule = draw_schedule(
        seed, SECONDS, nodes=cluster.node_ids, coordinators=COORDINATORS, producers=PRODUCERS
    )
    print(f"\nnemesis seed={seed} ({schedule.replay}):\n  " + "\n  ".join(map(str, schedule.steps)))
    admin = kafka.admin(secure_kafka.bootstrap, secure_kafka.config)
    wait_in_sync(admin, [t for t in admin.list_topics(timeout=10).topics if t.startswith("__")], 120)
    ensure_transaction_log(secure_kafka)
    namespace = f"nemesis{seed}x{os.urandom(3).hex()}"
    names = Topics(namespace)
    specs = internal_topics(namespace, PARTITIONS, 3)
    kafka.ensure_topics(secure_kafka.bootstrap, specs, extra=secure_kafka.config)
    # The last thing the stack undoes: after every coordinator and producer has stopped.
    stack.callback(delete_namespaces, secure_kafka.bootstrap, [namespace], extra=secure_kafka.config)
    topic = secure_topic(partitions=3)
    replicated = [names.half, names.op, names.state, names.producers, topic, TRANSACTION_LOG, OFFSETS_TOPIC]

    group_id = f"coord-{namespace}"

    def ids() -> list[str]:
        return transactional_ids(secure_kafka, namespace, PARTITIONS)

    flags = (
        "--command-config",
        str(secure_kafka.properties_file),
        "--group-id",
        group_id,
        "--log-interval",
        "5",
        # Back-checks soon: a killed producer's transactions are settled by one.
        *("--check-delay", "2", "--check-backoff", "1", "--check-backoff-max", "2"),
    )

    made: list[CoordinatorProcess] = []  # every coordinator of the run, renamed ones' too

    def new_coordinator(instance: str) -> CoordinatorProcess:
        made.append(
            supervised(
                secure_kafka,
                namespace,
                instance,
                log_path=tmp_path / f"coordinator-{instance}.log",
                secret=SECRET,
                args=flags,
            )
        )
        return made[-1]

    def second_group(instance: str) -> CoordinatorProcess:
        # Another group on the namespace, as a mistyped --group-id or a renaming upgrade makes.
        return CoordinatorProcess(
            secure_kafka.bootstrap,
            namespace,
            secret=SECRET,
            log_path=tmp_path / f"coordinator-{instance}.log",
            instance_id=instance,
            args=tuple(f"{group_id}-second" if a == group_id else a for a in flags),
        )

    instances = [f"c{i}" for i in range(COORDINATORS)]
    coordinators = [new_coordinator(i) for i in instances]
    # Registered before the watcher and producers, so it runs after them.
    stack.callback(lambda: [c.stop() for c in made])
    for coordinator in coordinators:
        coordinator.start()
    for coordinator in coordinators:
        coordinator.wait_ready(90)
    watcher = Watcher(secure_kafka, topic)
    watcher.start()
    stack.callback(watcher.stop)
    producers = Producers(
        secure_kafka,
        folder=tmp_path,
        namespace=namespace,
        partitions=PARTITIONS,
        topic=topic,
        secret=SECRET,
        count=PRODUCERS,
        threads=THREADS,
        per_thread=round(SECONDS * RATE_PER_THREAD * 8),  # a cap past the budget: finish() ends the load
        rate=RATE_PER_THREAD,
        work_ms=WORK_MS,
        group=f"chaos-{namespace}",  # instances of one group, each on a database of its own
        asyncio=frozenset({1}),  # one of each SDK: the asyncio one batches its decisions
    )
    stack.callback(producers.close)
    nemesis = Nemesis(
        schedule,
        cluster=cluster,
        admin=admin,
        replicated=replicated,
        coordinators=coordinators,
        instance_ids=instances,
        new_coordinator=new_coordinator,
        second_group=second_group,
        producers=producers,
        describe_node=functools.partial(
            roles, admin, half=names.half, topic=topic, group_id=group_id, ids=ids
        ),
    )
    stack.callback(nemesis.stop)  # before the producers close: a killed one is started again
    # Every wait inside a step is bounded (RECOVERY_TIMEOUT_S), so this only catches a call that
    # never returns. Room for slow boxes: a CI box once took past SECONDS * 3 + 180 (720 s) for one
    # seed's node lane (a rolling restart and two kills), every wait within its bound.
    budget = SECONDS * 6 + 180
    producers.start()
    nemesis.start()

    applied = nemesis.join(budget)
    assert producers.progress()[1] == 0, "the load ended before the faults did"
    time.sleep(STALL_TAIL_S)  # the last fault's stall is measured under load too
    producers.finish()
    finished = wait_until(lambda: producers.progress()[1] == PRODUCERS, 120)
    assert finished, f"producers not done 120s after the end of the load: {producers.progress()}"
    load_s = time.time() - nemesis.started
    wait_in_sync(admin, replicated, 180)
    records, barriers = producers.records(), producers.barriers()
    expected = tally(records, barriers, []).expected_messages
    # Bounded: until all is there, or nothing new came for longer than a fault's stall; then count.
    wait_until(lambda: watcher.seen() >= expected or watcher.quiet_for() > QUIET_S, 240, poll=1.0)
    time.sleep(3)  # a duplicate or a phantom would show up now
    watcher.stop()
    supervision = Supervised.of(made)
    seen = read_committed_elsewhere(secure_kafka, topic, timeout=60)
    seen_by_librdkafka = [value or b"" for _key, value in read_committed(secure_kafka, topic, timeout=60)]
    figures = tally(records, barriers, seen)
    last_end = max(r["end"] for r in records if "end" in r)
    by_partition = watcher.times_by(functools.partial(_half_partition, partitions=PARTITIONS))
    stalls = [a.stall(by_partition, STALL_TAIL_S, last_end) for a in applied]
    expired = read_committed(secure_kafka, names.expired)
    quarantined = read_committed(secure_kafka, names.quarantine)

    line = _summary(seed, applied, figures, stalls)
    print(
        f"\n{line}\n  transactions={figures.transactions} {dict(figures.reported)} "
        f"in_doubt={figures.in_doubt} ({figures.in_doubt_committed} committed) "
        f"op_unacknowledged={figures.op_unacknowledged} committed={figures.committed} "
        f"({figures.expected_messages} messages) expired={len(expired)} quarantined={len(quarantined)} "
        f"{op_batches(secure_kafka, names.op)} "
        f"coordinator_exits={len(supervision.exits)} producer_kills={producers.kills} "
        f"librdkafka_agrees={Counter(seen_by_librdkafka) == Counter(seen)}; "
        f"load {load_s:.0f}s, test {time.monotonic() - started:.0f}s"
    )
    if figures.examples:
        print(f"  examples: {figures.examples}")
    for a, stall in zip(applied, stalls, strict=True):
        said = "-" if stall is None else f"{stall:.1f}s"
        print(
            f"  {a.started - nemesis.started:+7.1f}s {a.step.kind} {a.step.target}: stall {said}; {a.detail}"
        )
    for at, log in supervision.stall_dumps:
        print(
            f"  {log} was silent for {STALL_DUMP_S:.0f}s at {at - nemesis.started:+.1f}s: stacks in its log"
        )
    for at, log, code, tail in supervision.exits:
        print(f"  {log} exited (code {code}) at {at - nemesis.started:+.1f}s:\n{tail}")
    if SUMMARY:
        with Path(SUMMARY).open("a") as out:
            out.write(line + "\n")

    assert figures.sdk_against_barrier == []
    lost_dup_phantom_order = (figures.lost, figures.duplicates, figures.phantom, figures.order_violations)
    assert lost_dup_phantom_order == (0, 0, 0, 0), figures.examples
    assert (len(expired), len(quarantined)) == (0, 0)
    stalled = [
        (a.step.kind, round(s)) for a, s in zip(applied, stalls, strict=True) if s and s > STALL_BOUND_S
    ]
    assert stalled == [], f"publishing stalled longer than {STALL_BOUND_S:.0f}s"


def _half_partition(value: bytes, partitions: int) -> int:
    """The half partition of the transaction a republished value belongs to."""
    producer, thread, seq, _n = (int(x) for x in value.decode().split("/"))
    return half_partition(key_of(producer, thread, seq).encode(), partitions)


def _summary(seed: int, applied: list[Applied], figures: Figures, stalls: list[float | None]) -> str:
    """One line per run: the seed, the faults of each kind, what the reader found, the longest stall."""
    kinds = Counter(a.step.kind for a in applied)
    longest = max((s for s in stalls if s is not None), default=0.0)
    return (
        f"nemesis seed={seed} seconds={SECONDS:g} faults: "
        + " ".join(f"{k}={n}" for k, n in sorted(kinds.items()))
        + f" | lost={figures.lost} dup={figures.duplicates} phantom={figures.phantom} "
        f"order={figures.order_violations} max_stall={longest:.1f}s"
    )
