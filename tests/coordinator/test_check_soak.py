"""A long randomised run: thousands of transactions, misbehaving check endpoints, nothing stranded.

Four producer groups, each with its own secret and endpoints, write transactions whose
outcome is fixed in advance (their "truth": COMMIT, ROLLBACK, or never answered). Some get
the producer's own op at once, some later, most none (left to back-checks). The endpoints
misbehave at random per request: error statuses, timeouts, slow answers near the timeout,
garbage bodies, dropped connections, partial answers. Besides:

- ``alpha``: one instance; the most chaos.
- ``beta``: two instances; the writer of the first half of the run leaves mid-run and its
  endpoint stops (a vanished target); the other instance answers.
- ``gamma``: the writer's URL has nothing listening (connection refused at every check); a
  helper instance answers.
- ``delta``: predates batches (a batch is a 400) and registers only after its first
  transactions' whole check schedule has passed (checks not asked meanwhile).

Two coordinators share the work: the second joins a third of the way in, the first stops two
thirds of the way in (partitions revoked with checks in flight). Every answer a transaction
gets on its last allowed check is a proper one, so the outcome is exact: a COMMIT is
published exactly once, a ROLLBACK never written, a never-answered one is in ``<ns>_expired``.

``TXBRIDGE_SOAK_SCALE`` scales the number of transactions (2,000 at 1.0, the default).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from coordinator.config import Secrets
from servers.broker import free_port
from tests.coordinator.check_server import CheckServer, Misbehaviour
from tests.coordinator.conftest import Env, RunningCoordinator
from tests.coordinator.wire_producer import Msg, WireProducer
from tests.kafka_helpers import read_topic
from txbridge.wire import CheckRequest, TxState, new_tx_id

pytestmark = [pytest.mark.integration, pytest.mark.soak]

SCALE = float(os.environ.get("TXBRIDGE_SOAK_SCALE", "1.0"))
TRANSACTIONS = max(60, round(2000 * SCALE))

MAX_CHECKS = 6
TIMEOUT_S = 1.0
#: The soak's check policy: quick, so never-answered transactions expire within seconds.
POLICY: dict[str, Any] = {
    "check_delay_s": 0.5,
    "check_backoff_s": 0.3,
    "check_backoff_max_s": 1.0,
    "max_checks": MAX_CHECKS,
    "check_timeout_s": TIMEOUT_S,
    "check_concurrency_per_group": 8,
    "check_batch_size": 100,
}
NEVER = "NEVER"  # a truth: the endpoint answers UNKNOWN to every check
#: After the first wave: longer than a transaction's whole check schedule (0.5 + 0.3 + 0.6 + 3 x 1 s),
#: so delta's first transactions could not be asked about during all of it.
DELTA_REGISTERS_AFTER_S = 8.0


@dataclass
class Chaos:
    """Random misbehaviour per request and per transaction; the last allowed check is always answered."""

    rng: random.Random
    rate: float  # share of requests that misbehave
    injected: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.injected[kind] += n

    def misbehave(self, _number: int, checks: Sequence[CheckRequest]) -> Misbehaviour | None:
        if any(c.attempt >= MAX_CHECKS for c in checks) or self.rng.random() >= self.rate:
            return None
        kind = self.rng.choice(["status", "timeout", "slow", "garbage", "drop"])
        self.count(kind)
        if kind == "status":
            status = self.rng.choice([401, 403, 404, 408, 429, 500, 502, 503])
            return Misbehaviour(status=status, body=_all_commit(checks))  # a non-200 never counts
        if kind == "timeout":
            return Misbehaviour(delay_s=TIMEOUT_S * 1.5)
        if kind == "slow":
            return Misbehaviour(delay_s=TIMEOUT_S * self.rng.uniform(0.5, 0.7))
        if kind == "garbage":
            body = self.rng.choice(
                [b"<html>oops</html>", b"", b"[]", b'{"states": []}', b'{"state": "commit"}']
            )
            return Misbehaviour(status=200, body=body)
        return Misbehaviour(drop=True)

    def script(self, truth: dict[str, str]) -> Callable[[CheckRequest], TxState | None]:
        def answer(req: CheckRequest) -> TxState | None:
            if req.attempt < MAX_CHECKS and self.rng.random() < self.rate / 4:
                self.count("partial")
                return None  # left out of the answer
            verdict = truth.get(req.tx_id, NEVER)
            return TxState.UNKNOWN if verdict == NEVER else TxState(verdict)

        return answer


def _all_commit(checks: Sequence[CheckRequest]) -> bytes:
    if len(checks) == 1:
        return b'{"state": "COMMIT"}'
    return json.dumps({"states": {c.tx_id: "COMMIT" for c in checks}}).encode()


@dataclass
class Group:
    """A producer group: its secret, its wire producer, its endpoints (one per instance)."""

    name: str
    secret: str
    producer: WireProducer
    servers: list[CheckServer]
    chaos: Chaos
    writer: str  # the instance writing its halves now


@dataclass(frozen=True)
class LateOp:
    wave: int  # written after this wave
    group: Group
    tx_id: str
    partition: int
    state: TxState
    count: int | None


class Soak:
    """The run: groups and their endpoints, the waves of transactions, the coordinators."""

    def __init__(self, env: Env, topic: str, rng: random.Random) -> None:
        self.env, self.topic, self.rng = env, topic, rng
        self.started = time.monotonic()
        self.first_wave_at: float | None = None
        self.truth: dict[str, str] = {}  # tx id -> COMMIT / ROLLBACK / NEVER
        self.messages: dict[str, int] = {}  # tx id -> its number of messages
        self.late_ops: list[LateOp] = []
        self.malformed = 0
        self.groups = {
            name: self._group(name, rate, batches)
            for name, rate, batches in [
                ("alpha", 0.5, True),
                ("beta", 0.4, True),
                ("gamma", 0.3, True),
                ("delta", 0.15, False),
            ]
        }
        self.delta_registered = False
        self.secrets = Secrets(by_group={g.name: g.secret for g in self.groups.values()})
        self.handles: list[RunningCoordinator] = []
        self.stopping: list[threading.Thread] = []

    def _group(self, name: str, rate: float, batches: bool) -> Group:
        chaos = Chaos(random.Random(self.rng.random()), rate)
        secret = f"soak-{name}-secret"
        servers = [
            CheckServer(
                secret.encode(), script=chaos.script(self.truth), batches=batches, misbehave=chaos.misbehave
            ).start()
            for _ in range(2 if name == "beta" else 1)
        ]
        producer = WireProducer(self.env.bootstrap, self.env.namespace, 3, group=name, instance=f"{name}-1")
        return Group(name, secret, producer, servers, chaos, f"{name}-1")

    def register(self) -> None:
        """Every group but delta heartbeats; gamma's writer names a URL nothing listens on."""
        alpha, beta, gamma = self.groups["alpha"], self.groups["beta"], self.groups["gamma"]
        alpha.producer.heartbeat(alpha.servers[0].url)
        beta.producer.heartbeat(beta.servers[0].url, instance="beta-1")
        beta.producer.heartbeat(beta.servers[1].url, instance="beta-2")
        gamma.producer.heartbeat(f"http://127.0.0.1:{free_port()}/txbridge/check", instance="gamma-1")
        gamma.producer.heartbeat(gamma.servers[0].url, instance="gamma-helper")

    def start_coordinator(self) -> None:
        self.handles.append(self.env.start(secrets=self.secrets, **POLICY))

    def stop_first_coordinator(self) -> None:
        """In a thread: a stop waits for the checks in flight, the producers go on meanwhile."""
        self.stopping.append(threading.Thread(target=self.handles[0].stop, name="stop-first"))
        self.stopping[-1].start()

    def beta_writer_leaves(self) -> None:
        beta = self.groups["beta"]
        beta.producer.leave(instance="beta-1")
        beta.servers[0].stop()
        beta.writer = "beta-2"

    def register_delta_when_due(self, *, wait: bool = False) -> None:
        if self.delta_registered:
            return
        assert self.first_wave_at is not None
        left = DELTA_REGISTERS_AFTER_S - (time.monotonic() - self.first_wave_at)
        if left > 0 and not wait:
            return
        time.sleep(max(left, 0.0))
        delta = self.groups["delta"]
        delta.producer.heartbeat(delta.servers[0].url)
        self.delta_registered = True

    def wave(self, number: int, size: int) -> None:
        """``size`` new transactions, the producer ops due now, then one flush per producer."""
        if self.first_wave_at is None:
            self.first_wave_at = time.monotonic()
        for _ in range(size):
            self._transaction(number)
        # Each op only once its halves are acknowledged, as the SDK writes them (the wire
        # contract, docs/wire-format.md): a COMMIT's wait for its halves ends at the half
        # partition's end offset read after the op, so an op that overtook its halves would
        # make the transaction an orphan.
        for group in self.groups.values():
            group.producer.flush()
        for op in [op for op in self.late_ops if op.wave <= number]:
            op.group.producer.op(op.tx_id, op.partition, op.state, count=op.count, flush=False)
        self.late_ops = [op for op in self.late_ops if op.wave > number]
        for group in self.groups.values():
            group.producer.flush()

    def _transaction(self, wave: int) -> None:
        rng = self.rng
        group = rng.choices(list(self.groups.values()), weights=[35, 30, 20, 15])[0]
        verdict = rng.choices(["COMMIT", "ROLLBACK", NEVER], weights=[45, 35, 20])[0]
        key = f"key-{rng.randrange(400)}".encode()
        tx_id = new_tx_id()
        messages = [
            Msg(self.topic, f"{tx_id}-{seq}".encode(), key=key) for seq in range(rng.choice([1, 1, 2]))
        ]
        self.truth[tx_id], self.messages[tx_id] = verdict, len(messages)  # before its halves: checks may come
        _, partition = group.producer.halves(messages, tx_id=tx_id, instance=group.writer, flush=False)
        if verdict != NEVER:
            state = TxState(verdict)
            count = len(messages) if state is TxState.COMMIT else None
            roll = rng.random()
            if roll < 0.3:  # the producer's own decision at once (once the wave's halves are acknowledged)
                self.late_ops.append(LateOp(wave, group, tx_id, partition, state, count))
            elif roll < 0.4:  # ... or later, maybe after a check decided it already
                self.late_ops.append(
                    LateOp(wave + rng.randrange(3, 15), group, tx_id, partition, state, count)
                )
        if rng.random() < 0.005:  # a third-party producer's garbage on the same partitions
            group.producer.raw(self.env.topics.half, partition, b"garbage", b"no txbridge headers")
            group.producer.raw(self.env.topics.op, partition, b"garbage", b"not json")
            self.malformed += 2

    def finish_producing(self) -> None:
        for op in self.late_ops:
            op.group.producer.op(op.tx_id, op.partition, op.state, count=op.count)
        self.late_ops = []
        self.register_delta_when_due(wait=True)

    def live(self) -> list[RunningCoordinator]:
        return [h for h in self.handles if h.thread.is_alive()]

    def pending(self) -> int:
        return sum(len(s.pending) for h in self.live() for s in h.service.partitions.values())

    def expected(self, truth: str) -> set[str]:
        return {tx for tx, verdict in self.truth.items() if verdict == truth}

    def outcome(self, timeout: float) -> tuple[Counter[str], set[str]]:
        """What the topic and ``<ns>_expired`` show once every partition is owned and nothing is
        pending, and every expected outcome is there (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while True:
            settled = sum(len(h.service.partitions) for h in self.live()) == 3 and self.pending() == 0
            late = time.monotonic() >= deadline
            if settled or late:
                published = Counter(
                    s.headers["txb.tx"].decode() for s in read_topic(self.env.bootstrap, self.topic)
                )
                expired = {
                    s.headers["txb.tx"].decode()
                    for s in read_topic(self.env.bootstrap, self.env.topics.expired)
                }
                if late or (set(published) >= self.expected("COMMIT") and expired >= self.expected(NEVER)):
                    break
            time.sleep(2.0)
        for thread in self.stopping:
            thread.join(60)
        return published, expired

    def injected(self) -> Counter[str]:
        """The endings injected, by kind."""
        out: Counter[str] = Counter()
        for group in self.groups.values():
            out.update(group.chaos.injected)
        stats: Counter[str] = Counter()
        for handle in self.handles:
            stats.update(handle.service.stats)
        out["connection_refused"] = self.groups["gamma"].servers[0].requests  # each after gamma-1 refused
        out["batch_refused_400"] = self.groups["delta"].servers[0].rejected
        out["not_asked"] = stats["checks_not_asked"]
        out["target_vanished"] = 1
        out["partitions_moved"] = 2
        return out

    def close(self) -> None:
        for group in self.groups.values():
            for server in group.servers:
                server.stop()


def _trace(env: Env, tx_ids: list[str]) -> str:
    """What Kafka holds of ``tx_ids`` (their halves, ops and ``<ns>_state`` entries, every
    version, read_uncommitted) and the positions records of their partitions: a failure's story."""
    wanted = set(tx_ids)
    lines: list[str] = []
    halves = read_topic(env.bootstrap, env.topics.half, isolation="read_uncommitted")
    partitions = set()
    for s in halves:
        tx = s.headers.get("txb.tx", b"").decode(errors="replace")
        if tx in wanted:
            partitions.add(s.partition)
            lines.append(f"half {tx} {s.partition}/{s.offset}")
    for s in read_topic(env.bootstrap, env.topics.op, isolation="read_uncommitted"):
        if any(tx.encode() in (s.value or b"") for tx in wanted):
            lines.append(f"op {s.partition}/{s.offset}: {(s.value or b'')[:200]!r}")
    committed = {(s.partition, s.offset) for s in read_topic(env.bootstrap, env.topics.state)}
    for s in read_topic(env.bootstrap, env.topics.state, isolation="read_uncommitted"):
        if (s.partition, s.offset) not in committed:
            key = (s.key or b"").decode(errors="replace")
            if key in wanted or s.partition in partitions:
                lines.append(f"state {s.partition}/{s.offset} aborted {key!r}")
            continue
        key = (s.key or b"").decode(errors="replace")
        if key in wanted or (key.startswith("\x00") and s.partition in partitions):
            lines.append(f"state {s.partition}/{s.offset} {key!r}: {(s.value or b'')[:300]!r}")
    return "\n".join(lines)


def test_no_transaction_is_stranded_whatever_the_check_endpoints_do(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    soak = Soak(
        env, topic_factory(partitions=6), random.Random(int(os.environ.get("TXBRIDGE_SOAK_SEED", "13")))
    )
    try:
        soak.register()
        soak.start_coordinator()
        waves = max(10, TRANSACTIONS // 50)
        for number in range(waves):
            if number == waves // 3:
                soak.start_coordinator()  # the partitions move ...
            if number == 2 * waves // 3:
                soak.stop_first_coordinator()  # ... and move again
            if number == waves // 2:
                soak.beta_writer_leaves()
            soak.wave(number, len(range(number, TRANSACTIONS, waves)))
            soak.register_delta_when_due()
            time.sleep(0.1)
        soak.finish_producing()
        produced_s = time.monotonic() - soak.started

        published, expired = soak.outcome(timeout=120 + 60 * SCALE)
        commits, rollbacks, never = soak.expected("COMMIT"), soak.expected("ROLLBACK"), soak.expected(NEVER)
        rolled_back = len(rollbacks - set(published) - expired) if soak.pending() == 0 else "?"
        stranded = set(soak.truth) - set(published) - expired - rollbacks
        injected = dict(sorted(soak.injected().items()))
        print(
            f"\ncheck soak: {len(soak.truth)} transactions ({len(commits)} COMMIT, "
            f"{len(rollbacks)} ROLLBACK, {len(never)} never answered); endings injected {injected}; "
            f"malformed records {soak.malformed}; published {len(published)}, rolled back {rolled_back}, "
            f"expired {len(expired)}, pending {soak.pending()}, stranded {len(stranded)}; "
            f"produced in {produced_s:.0f} s, done in {time.monotonic() - soak.started:.0f} s"
        )

        assert soak.pending() == 0
        assert stranded == set(), (
            f"{len(stranded)} transactions neither published, rolled back nor expired:\n"
            + _trace(env, sorted(stranded))
        )
        against = set(published) - commits
        assert against == set(), f"{len(against)} published against their truth"
        not_once = {tx: n for tx, n in published.items() if n != soak.messages[tx]}
        assert not_once == {}, f"{len(not_once)} transactions published other than exactly once"
        wrongly_expired = expired - never
        assert wrongly_expired == set(), f"{len(wrongly_expired)} expired although their endpoint answered"
        uncommitted = read_topic(env.bootstrap, soak.topic, isolation="read_uncommitted")
        assert not {s.headers["txb.tx"].decode() for s in uncommitted} & (rollbacks | never)
        assert len(read_topic(env.bootstrap, env.topics.quarantine)) == soak.malformed
    finally:
        soak.close()
