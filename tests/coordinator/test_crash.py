"""SIGKILL a coordinator subprocess mid-stream; another one takes over. Exactly once, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TRANSACTIONS = 2400
BATCH = 60


class Proc:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "TXBRIDGE_DEFAULT_SECRET": SECRET}
        with log.open("wb") as out:
            self.popen = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_assigned(self, timeout: float = 60.0) -> None:
        ok = eventually(
            lambda: "assigned partitions [" in self.text() or self.popen.poll() is not None, timeout
        )
        assert ok, f"coordinator did not start:\n{self.text()[-3000:]}"
        assert self.popen.poll() is None, f"coordinator exited:\n{self.text()[-3000:]}"


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(10)


def test_sigkill_mid_stream_then_takeover_keeps_exactly_once_and_order(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    procs: list[Proc],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=3)
    config = tmp_path / "coordinator.toml"
    config.write_text(
        f'namespace = "{env.namespace}"\ngroup_id = "coord-{env.namespace}"\n'
        "check_delay_s = 1.0\ncheck_backoff_s = 0.5\ncheck_backoff_max_s = 1.0\nmax_checks = 100\n"
        "producer_liveness_s = 600.0\n"
        'log_interval_s = 2.0\n[extra_config]\n"session.timeout.ms" = 6000\n"heartbeat.interval.ms" = 1000\n'
    )
    # What the producer's local transactions ended in, as a barrier answers: UNKNOWN until the
    # test has decided (a check may come before the op under load: check_delay is 1 s).
    local: dict[str, TxState] = {}
    check_server.script = lambda req: local.get(req.tx_id, TxState.UNKNOWN)
    env.producer.heartbeat(check_server.url)

    def start(name: str) -> Proc:
        args = [sys.executable, "-m", "coordinator", "--config", str(config), "--bootstrap", env.bootstrap]
        proc = Proc([*args, "--instance-id", name], tmp_path / f"{name}.log")
        procs.append(proc)
        return proc

    first = start("A")
    first.wait_assigned()
    second = start("B")
    second.wait_assigned()

    expected: dict[str, int] = {}  # committed tx id -> message count
    never: set[str] = set()
    order: dict[bytes, list[str]] = defaultdict(list)  # key -> committed tx ids in decision order
    killed = False
    for start_index in range(0, TRANSACTIONS, BATCH):
        pending_ops = []
        for i in range(start_index, start_index + BATCH):
            kind = i % 10
            if kind == 9:  # UNKNOWN: the back-check decides
                key = f"u{i % 7}".encode()
                tx_id, _ = env.producer.halves([Msg(topic, f"{i}".encode(), key=key)], flush=False)
                if i % 20 == 9:
                    local[tx_id] = TxState.COMMIT
                    expected[tx_id] = 1
                else:
                    local[tx_id] = TxState.ROLLBACK
                    never.add(tx_id)
                continue
            key = f"k{i % 13}".encode()
            count = 1 + i % 2
            messages = [Msg(topic, f"{i}/{n}".encode(), key=key) for n in range(count)]
            tx_id, partition = env.producer.halves(messages, flush=False)
            if kind == 8:
                never.add(tx_id)
                pending_ops.append((tx_id, partition, TxState.ROLLBACK, None))
            else:
                expected[tx_id] = count
                order[key].append(tx_id)
                pending_ops.append((tx_id, partition, TxState.COMMIT, count))
        env.producer.flush()  # halves are acknowledged before any op, as the SDK does
        for tx_id, partition, state, count in pending_ops:
            local[tx_id] = state
            env.producer.op(tx_id, partition, state, count=count, flush=False)
        env.producer.flush()
        if not killed and start_index >= TRANSACTIONS // 3:
            os.kill(first.popen.pid, signal.SIGKILL)
            first.popen.wait(10)
            killed = True

    total = sum(expected.values())
    eventually(lambda: len(read_topic(env.bootstrap, topic)) >= total, timeout=180, interval=2)
    time.sleep(3)  # anything extra (a duplicate) would show up now
    seen = read_topic(env.bootstrap, topic)

    per_tx = Counter(s.headers["txb.tx"].decode() for s in seen)
    assert {tx: n for tx, n in per_tx.items() if expected.get(tx) != n} == {}
    assert set(per_tx) == set(expected)
    assert not set(per_tx) & never
    by_key: dict[bytes, list[str]] = defaultdict(list)
    for s in sorted(seen, key=lambda s: (s.partition, s.offset)):
        tx = s.headers["txb.tx"].decode()
        if s.key in order and (not by_key[s.key] or by_key[s.key][-1] != tx):
            by_key[s.key].append(tx)
    assert by_key == {k: v for k, v in order.items()}
    assert "assigned partitions [0, 1, 2]" in second.text()
