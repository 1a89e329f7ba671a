"""The pieces of the chaos tests (``test_broker_chaos.py``, ``test_nemesis.py``): where Kafka puts
things, the processes under test, the readers (one that times what it sees, one on another
client than the SDK's), and the tally of what they saw.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.commit import changelog
from servers.cluster import LocalCluster
from servers.coordinator_process import CoordinatorProcess
from servers.placement import (
    OFFSETS_TOPIC,
    TRANSACTION_LOG,
    coordinator_node,
    leaders,
    partition_for,
)
from tests.secure import chaos_producer
from tests.secure.conftest import SecureKafka, read_committed
from txbridge import kafka as txkafka
from txbridge.topics import internal_topics
from txbridge.wire import Topics, decode_ops

#: A coordinator whose log is silent this long (it logs its counts every 5 s) gets SIGUSR1.
STALL_DUMP_S = 20.0

ROOT = Path(__file__).resolve().parents[2]


def ensure_transaction_log(kafka: SecureKafka) -> None:
    """The broker creates ``__transaction_state`` at the first transactional producer's request."""
    warm_id = f"warm-{uuid.uuid4().hex[:8]}"
    producer = txkafka.producer(kafka.bootstrap, kafka.config, transactional_id=warm_id)
    txkafka.init_transactions(producer, 60)


def out_of_sync(admin: AdminClient, topics: Sequence[str]) -> list[str]:
    """The partitions of ``topics`` with a replica out of sync, or no leader."""
    metadata = admin.list_topics(timeout=10).topics
    return [
        f"{topic}/{number}"
        for topic in topics
        for number, meta in metadata[topic].partitions.items()
        if len(meta.isrs) < len(meta.replicas) or meta.leader < 0
    ]


def wait_in_sync(admin: AdminClient, topics: Sequence[str], timeout: float) -> float:
    """Wait until every replica of ``topics`` is in sync; returns how long it took."""
    started = time.monotonic()
    behind = out_of_sync(admin, topics)
    while behind:
        assert time.monotonic() - started < timeout, f"not in sync within {timeout:.0f}s: {behind}"
        time.sleep(0.5)
        behind = out_of_sync(admin, topics)
    return time.monotonic() - started


def wait_serving(cluster: LocalCluster, node: int, timeout: float) -> None:
    """Wait until node ``node`` answers a metadata request itself.

    A node serves clients only once it has registered again and caught up with the metadata
    log; a node registering after an unclean shutdown is out of the ISRs until its replicas
    catch up, so the sync state that follows is the restarted node's. (Right after a SIGKILL
    the cluster's metadata still lists the dead node, and every replica in sync, for the
    broker session timeout.) A client bootstrapped on the node alone gets its first answer from
    it, whatever ``orig_broker_id`` says: -1 for the bootstrap connection, or another node once
    the client has learnt them from that answer (``servers.cluster_nodes._serving``). So any
    answer counts.
    """
    address = next(n.address for n in cluster.status().nodes if n.node_id == node)
    settings = {**cluster.client_config(), "log_level": 0}  # refused connections are expected
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:  # a new client each time: its first answer comes from its only bootstrap server
            txkafka.admin(address, settings).list_topics(timeout=2)
        except KafkaException as exc:
            last_error = str(exc)
        else:
            return
        if time.monotonic() >= deadline:
            state = next(n for n in cluster.status().nodes if n.node_id == node)
            raise AssertionError(
                f"node {node} does not serve clients {timeout:.0f}s after its start (its process "
                f"{'runs, pid ' + str(state.pid) if state.running else 'has exited'}; last error: "
                f"{last_error or 'none'}); its logs end:\n{cluster.log_tail(node, 40)}"
            )
        time.sleep(0.5)


def create_led_by(kafka: SecureKafka, namespace: str, partitions: int, leader: int) -> None:
    """The internal topics, RF 3, with ``leader`` the preferred leader of every half and op partition."""
    names = Topics(namespace)
    specs = internal_topics(namespace, partitions, 3)
    others = [n for n in kafka.cluster.node_ids if n != leader]
    assignment = [[leader, *others[p % 2 :], *others[: p % 2]] for p in range(partitions)]
    led = [
        NewTopic(s.name, partitions, replica_assignment=assignment, config=dict(s.config))
        for s in specs
        if s.name in (names.half, names.op)
    ]
    admin = txkafka.admin(kafka.bootstrap, kafka.config)
    for future in admin.create_topics(led, operation_timeout=30).values():
        future.result(timeout=30)
    txkafka.ensure_topics(kafka.bootstrap, specs, extra=kafka.config)


def transactional_ids(secure: SecureKafka, namespace: str, partitions: int) -> list[str]:
    """The transactional ids the coordinators commit under now: those their claim records in
    ``<ns>_state`` name (one per live coordinator incarnation; a new one at each restart)."""
    owners = changelog.read_owners(
        secure.bootstrap, Topics(namespace).state, list(range(partitions)), secure.config, 30.0
    )
    return sorted({owner for reads in owners.values() for owner in changelog.claimants(reads)})


def transaction_coordinators(admin: AdminClient, ids: Sequence[str]) -> Counter[int]:
    """How many of the transactional ``ids`` each broker is the transaction coordinator of."""
    log = leaders(admin, TRANSACTION_LOG)
    return Counter(log[partition_for(i, len(log))] for i in ids)


def roles(
    admin: AdminClient, node: int, *, half: str, topic: str, group_id: str, ids: Callable[[], Sequence[str]]
) -> str:
    """What ``node`` is to the run right now (said in the summary of a kill); ``ids``: reads the
    coordinators' transactional ids."""
    said = [
        f"leads {sum(n == node for n in leaders(admin, half).values())}/{len(leaders(admin, half))} half",
        f"{sum(n == node for n in leaders(admin, topic).values())} of the topic's partitions",
    ]
    try:
        current = ids()
    except Exception as exc:  # a node down: the summary says so instead
        said.append(f"transactional ids not read: {exc}")
        current = []
    hosted = transaction_coordinators(admin, current)[node]
    if hosted:
        said.append(f"transaction coordinator of {hosted}/{len(current)} coordinator transactional ids")
    if coordinator_node(admin, OFFSETS_TOPIC, group_id) == node:
        said.append("the coordinators' group coordinator")
    return "; ".join(said)


# ------------------------------------------------------------------ the processes


def supervised(
    kafka: SecureKafka, namespace: str, instance: str, *, log_path: Path, secret: str, args: Sequence[str]
) -> CoordinatorProcess:
    """A coordinator child under ``instance``, restarted when it exits on its own, as a deployment's
    supervisor does (``restart: unless-stopped`` in compose/); SIGUSR1 when its log is silent
    for :data:`STALL_DUMP_S`, so its log shows where it waits."""
    return CoordinatorProcess(
        kafka.bootstrap,
        namespace,
        secret=secret,
        log_path=log_path,
        instance_id=instance,
        args=args,
        supervise=True,
        stall_dump_s=STALL_DUMP_S,
    )


@dataclass(frozen=True)
class Supervised:
    """What the supervision of some coordinators saw, in time order: each exit on its own as
    (wall time, log file name, exit code, last log lines), each stack dump as (wall time, log file name)."""

    exits: list[tuple[float, str, int | None, str]]
    stall_dumps: list[tuple[float, str]]

    @classmethod
    def of(cls, coordinators: Iterable[CoordinatorProcess]) -> Supervised:
        coordinators = list(coordinators)
        return cls(
            sorted((at, c.log_path.name, code, tail) for c in coordinators for at, code, tail in c.exits),
            sorted((at, c.log_path.name) for c in coordinators for at in c.stall_dumps),
        )


@dataclass
class Producers:
    """The SDK producer processes (``chaos_producer``): their outcome files and barrier databases.

    A producer SIGKILLed (:meth:`kill`) and started again (:meth:`restart`) goes on where it
    stopped, with the same outcome file and database.
    """

    kafka: SecureKafka
    _: KW_ONLY
    folder: Path
    namespace: str
    partitions: int
    topic: str
    secret: str
    count: int
    threads: int
    per_thread: int
    rate: float
    #: Each local transaction's work, in ms (chaos_producer's --work-ms).
    work_ms: float = 0.0
    #: One producer group for every process, each still on its own database (None: a group each).
    group: str | None = None
    #: The processes that run the asyncio SDK (``--asyncio``: its decisions of one loop turn
    #: share an op record); the others run the blocking one.
    asyncio: frozenset[int] = frozenset()
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: The producers killed and not started again yet.
    down: set[int] = field(default_factory=set)
    #: SIGKILLs so far.
    kills: int = 0

    @property
    def total(self) -> int:
        return self.count * self.threads * self.per_thread

    def out(self, index: int) -> Path:
        return self.folder / f"producer-{index}.jsonl"

    def db(self, index: int) -> Path:
        return self.folder / f"producer-{index}.db"

    def log(self, index: int) -> Path:
        return self.folder / f"producer-{index}.log"

    @property
    def stop_file(self) -> Path:
        return self.folder / "producers.stop"

    def start(self) -> None:
        self.procs = [self._launch(index) for index in range(self.count)]

    def _launch(self, index: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, chaos_producer.SECRET_ENV: self.secret}
        cmd = [sys.executable, "-m", "tests.secure.chaos_producer", "--bootstrap", self.kafka.bootstrap]
        cmd += ["--command-config", str(self.kafka.properties_file), "--namespace", self.namespace]
        cmd += ["--partitions", str(self.partitions), "--topic", self.topic, "--index", str(index)]
        cmd += ["--threads", str(self.threads), "--transactions", str(self.per_thread)]
        cmd += ["--rate", str(self.rate), "--work-ms", str(self.work_ms), "--stop-file", str(self.stop_file)]
        cmd += ["--db", str(self.db(index)), "--out", str(self.out(index))]
        if self.group is not None:
            cmd += ["--group", self.group]
        if index in self.asyncio:
            cmd += ["--asyncio"]
        with self.log(index).open("ab") as log:  # a restart's lines follow the killed one's
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=log)

    def kill(self, index: int) -> None:
        """SIGKILL producer ``index``: no op record, no answer to checks until :meth:`restart`."""
        self.down.add(index)
        proc = self.procs[index]
        if proc.poll() is None:
            proc.kill()
            self.kills += 1
        proc.wait(30)

    def finish(self) -> None:
        """Make every producer stop sending (after its current transaction) and write ``done``."""
        self.stop_file.touch()

    def restart(self, index: int) -> None:
        """Start killed producer ``index`` again: it goes on after the last seq on record."""
        self.procs[index] = self._launch(index)
        self.down.discard(index)

    def records(self) -> list[dict[str, Any]]:
        """Every whole line of every outcome file, with the producer's index (a line a SIGKILL cut
        short is left out)."""
        lines = []
        for index in range(self.count):
            path = self.out(index)
            text = path.read_text() if path.exists() else ""
            for line in text.split("\n")[:-1]:  # the last one may be half written
                try:
                    lines.append({**json.loads(line), "index": index})
                except json.JSONDecodeError:
                    continue
        return lines

    def progress(self) -> tuple[int, int]:
        """(transactions done, producers done); raises if a producer died (not killed by :meth:`kill`)."""
        for index, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and index not in self.down:
                raise AssertionError(
                    f"producer {index} exited with {code}:\n{self.log(index).read_text()[-3000:]}"
                )
        records = self.records()
        return sum("seq" in r for r in records), len({r["index"] for r in records if "done" in r})

    def barriers(self) -> dict[int, dict[str, str]]:
        """Each producer's barrier rows: tx id -> 'committed' / 'rolled_back'."""
        rows = {}
        for index in range(self.count):
            with sqlite3.connect(self.db(index)) as db:
                rows[index] = dict(db.execute("SELECT tx_id, state FROM txbridge_barrier").fetchall())
        return rows

    def close(self) -> None:
        """Close their stdin (they stop serving back-checks and exit); kill any that hangs."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# ------------------------------------------------------------------ what a reader sees during the run


class Watcher:
    """A read_committed consumer of the real topic for the whole run: when each value was first seen."""

    def __init__(self, kafka: SecureKafka, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.first_seen: dict[bytes, float] = {}
        #: When the last new message was seen (monotonic).
        self.last_new = time.monotonic()
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def seen(self) -> int:
        if self.failure is not None:
            raise AssertionError(f"the watching consumer failed: {self.failure!r}")
        return len(self.first_seen)

    def quiet_for(self) -> float:
        """Seconds since a new message was last seen."""
        return time.monotonic() - self.last_new

    def _run(self) -> None:
        try:
            consumer = txkafka.consumer(
                self.kafka.bootstrap, f"watcher-{uuid.uuid4().hex[:8]}", self.kafka.config
            )
            try:
                partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
                consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
                while not self._stop.is_set():
                    for msg in consumer.consume(500, 0.2):
                        err = msg.error()
                        if err is not None and err.fatal():
                            raise RuntimeError(err.str())
                        value = msg.value() or b""
                        if err is None and value not in self.first_seen:
                            self.first_seen[value] = time.time()
                            self.last_new = time.monotonic()
            finally:
                consumer.close()
        except BaseException as exc:  # the test's thread reports it (seen())
            self.failure = exc

    def times(self) -> list[float]:
        return sorted(self.first_seen.values())

    def times_by(self, group: Callable[[bytes], int]) -> list[list[float]]:
        """The first sightings of each group of values (e.g. by half partition), each sorted."""
        groups: dict[int, list[float]] = defaultdict(list)
        for value, seen in list(self.first_seen.items()):
            groups[group(value)].append(seen)
        return [sorted(times) for _, times in sorted(groups.items())]


def read_committed_elsewhere(kafka: SecureKafka, topic: str, *, timeout: float = 60.0) -> list[bytes]:
    """Every value of ``topic`` as kafka-python reads it, read_committed, to each partition's last
    stable offset: a client with no code in common with librdkafka, which the SDK and the
    coordinator use.

    Raises:
        TimeoutError: a partition was not read to its end within ``timeout``.
    """
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPartition

    settings = kafka.config
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap.split(","),
        security_protocol=settings["security.protocol"],
        sasl_mechanism=settings["sasl.mechanisms"],
        sasl_plain_username=settings["sasl.username"],
        sasl_plain_password=settings["sasl.password"],
        ssl_cafile=settings["ssl.ca.location"],
        isolation_level="read_committed",
        group_id=None,
        enable_auto_commit=False,
    )
    try:
        partitions = [KafkaPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"kafka-python sees no partitions of {topic}"
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)  # read_committed: the last stable offsets
        seen: list[bytes] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                behind = {tp.partition: (consumer.position(tp), ends[tp]) for tp in partitions}
                raise TimeoutError(f"{topic}: kafka-python at (position, end) {behind} after {timeout:.0f}s")
            for batch in consumer.poll(timeout_ms=500).values():
                seen += [record.value or b"" for record in batch]
        return seen
    finally:
        consumer.close()


def op_batches(kafka: SecureKafka, topic: str) -> str:
    """What the asyncio SDK batched in op topic ``topic``: its records of several decisions (no
    key), and how many decisions they hold; for the summary, to show the faults met batches."""
    batches = [value for key, value in read_committed(kafka, topic) if not key]
    return f"op_batches={len(batches)} ({sum(len(decode_ops(v)) for v in batches)} decisions)"


def longest_gap(times: Sequence[float], start: float, end: float) -> float:
    """The longest wait for a new message between ``start`` (a kill) and ``end`` (the next kill,
    or the last transaction's end): between consecutive first sightings, from the last one
    before ``start``, and from the last one to ``end``."""
    before = [t for t in times if t <= start]
    points = [before[-1] if before else start, *(t for t in times if start < t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


# ------------------------------------------------------------------ the tally


@dataclass
class Figures:
    """What the producers reported and their barriers hold, against what a reader saw."""

    transactions: int = 0
    reported: Counter[str] = field(default_factory=Counter)
    #: Transactions begun by a producer that was killed before it had the result: their
    #: barrier row decides them (``in_doubt_committed`` of them committed).
    in_doubt: int = 0
    in_doubt_committed: int = 0
    op_unacknowledged: int = 0
    sdk_against_barrier: list[str] = field(default_factory=list)
    committed: int = 0
    expected_messages: int = 0
    lost: int = 0
    duplicates: int = 0
    phantom: int = 0
    order_violations: int = 0
    examples: list[str] = field(default_factory=list)


def tally(
    records: list[dict[str, Any]], barriers: dict[int, dict[str, str]], seen: Sequence[bytes]
) -> Figures:
    """Compare the outcome records and barrier rows with the values a reader saw, in its order.

    Committed means the barrier holds the transaction as committed (the SDK reported COMMIT, or
    an UNKNOWN the check settles COMMIT); each of its messages must be seen once. So does a
    transaction in doubt (``begun`` on record, no result: its producer was killed) that the
    barrier holds as committed. A value of any other transaction is a phantom. Per key,
    transactions must be seen in their sequence order (a key's transactions are sent one after
    another by one thread).
    """
    figures = Figures()
    committed: dict[tuple[int, int, int], int] = {}  # (producer, thread, seq) -> messages
    done = {(r["index"], r["thread"], r["seq"]) for r in records if "seq" in r}
    for r in records:
        begun = r.get("begun")
        if begun is None or (r["index"], begun["thread"], begun["seq"]) in done:
            continue
        figures.in_doubt += 1
        if barriers[r["index"]].get(begun["tx"]) == "committed":
            figures.in_doubt_committed += 1
            committed[(r["index"], begun["thread"], begun["seq"])] = begun["messages"]
    for r in records:
        if "seq" not in r:
            continue
        figures.transactions += 1
        figures.reported[r["state"] or "RAISED"] += 1
        figures.op_unacknowledged += r["tx"] is not None and not r["op_ack"]
        verdict = barriers[r["index"]].get(r["tx"]) if r["tx"] else None
        if r["state"] != "UNKNOWN" and (r["state"] == "COMMIT") != (verdict == "committed"):
            figures.sdk_against_barrier.append(f"{r['tx']}: SDK {r['state']}, barrier {verdict}")
        if verdict == "committed":
            committed[(r["index"], r["thread"], r["seq"])] = r["messages"]
    figures.committed = len(committed)
    expected = {
        chaos_producer.value_of(*sender, n).encode()
        for sender, count in committed.items()
        for n in range(count)
    }
    figures.expected_messages = len(expected)
    delivered = Counter(seen)
    lost = [v for v in expected if delivered[v] == 0]
    phantoms = [v for v in delivered if v not in expected]
    figures.lost = len(lost)
    figures.duplicates = sum(n - 1 for v, n in delivered.items() if v in expected)
    figures.phantom = sum(delivered[v] for v in phantoms)
    figures.examples += [f"lost {v.decode()} ({_key(v)})" for v in lost[:5]]
    figures.examples += [f"phantom {v!r}" for v in phantoms[:5]]
    by_key: dict[str, list[int]] = defaultdict(list)
    for value in dict.fromkeys(v for v in seen if v in expected):  # first sightings, in order
        producer, thread, seq, _n = (int(x) for x in value.decode().split("/"))
        seqs = by_key[chaos_producer.key_of(producer, thread, seq)]
        if not seqs or seqs[-1] != seq:
            seqs.append(seq)
    for key, seqs in by_key.items():
        inversions = [(a, b) for a, b in itertools.pairwise(seqs) if b < a]
        figures.order_violations += len(inversions)
        figures.examples += [f"{key}: seq {a} seen before seq {b}" for a, b in inversions[:3]]
    return figures


def _key(value: bytes) -> str:
    """The key of a republished value (which names its half partition)."""
    producer, thread, seq, _n = (int(x) for x in value.decode().split("/"))
    return f"key {chaos_producer.key_of(producer, thread, seq)}"


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.5) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
