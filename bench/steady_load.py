"""Steady loads of one message per transaction, through txbridge or native Kafka transactions.

Each runs in a thread of its own until stopped, at a fixed rate with no catch-up (:class:`Pace`),
and records, by the id in each message's ``txb.tx`` header, when the application committed it
and when that commit was acknowledged, for a read_committed reader
(:class:`bench.txbridge_runs.Watcher`) to time against.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from typing import Any

from bench import txbridge_runs as tb
from bench.kafka_native import BenchError
from txbridge import kafka
from txbridge.aio import AsyncTransactionProducer
from txbridge.kafka import KafkaException
from txbridge.transaction import LocalTransaction, Message
from txbridge.wire import H_TX, TxState

#: The messages' keys, in turn: every partition of a real topic gets some.
KEYS = [str(i).encode() for i in range(60)]


class Pace:
    """One transaction every 1/rate s. One that is late goes at once, and those after it keep
    the rate from there: no burst to catch up after a stall, so both paths of a comparison send
    at the same rate whatever blocked them."""

    def __init__(self, rate: float) -> None:
        self._interval = 1 / rate
        self._next = time.monotonic()

    def delay(self) -> float:
        """Seconds to wait before the next transaction."""
        now = time.monotonic()
        wait = max(0.0, self._next - now)
        self._next = max(self._next, now) + self._interval
        return wait


class Load:
    """One path's load in a thread of its own, from :meth:`start` to :meth:`stop`.

    Attributes:
        decided: the wall time the application committed each message's transaction, by the
            message's id: when its local transaction returned COMMIT (txbridge), when
            ``commit_transaction`` was called (native). A commit that blocks counts from here.
        committed: the wall time that commit was acknowledged: when the SDK reported COMMIT
            (txbridge), when ``commit_transaction`` returned (native).
        outcomes: how many transactions ended how (``COMMIT``, ``aborted (...)``, ...).
        error: what ended the load early, if anything.
    """

    name = ""

    def __init__(self, topic: str, value: bytes, rate: float) -> None:
        self.topic = topic
        self.value = value
        self.rate = rate
        self.decided: dict[str, float] = {}
        self.committed: dict[str, float] = {}
        self.outcomes: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"load-{self.name}", daemon=True)

    def start(self, timeout: float = 120.0) -> None:
        """Start, and wait until the first transaction can begin.

        Raises:
            BenchError: the load failed or did not get ready within ``timeout``.
        """
        self._thread.start()
        if not self._ready.wait(timeout):
            raise BenchError(f"the {self.name} load did not start within {timeout:.0f}s")
        self.check()

    def check(self) -> None:
        """Raises :class:`BenchError` if the load failed."""
        if self.error is not None:
            raise BenchError(f"the {self.name} load failed: {self.error!r}") from self.error

    def stop(self, timeout: float = 120.0) -> None:
        """Stop after the transaction under way.

        Raises:
            BenchError: the load failed, or did not stop within ``timeout``.
        """
        self.halt(timeout)
        if self._thread.is_alive():
            raise BenchError(f"the {self.name} load did not stop within {timeout:.0f}s")
        self.check()

    def halt(self, timeout: float = 120.0) -> None:
        """Stop, whatever the outcome (for cleanup)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by check(): a silent thread would look like a stall
            self.error = exc
        finally:
            self._ready.set()  # start() never waits out a load that failed

    def _run(self) -> None:
        raise NotImplementedError


class TxbridgeLoad(Load):
    """The SDK's asyncio producer, one transaction at a time; its back-check answers COMMIT.

    A message's id is its transaction's id; the application committed it when its local
    transaction returned COMMIT, and the commit was acknowledged when the SDK reported COMMIT.
    """

    name = "txbridge"

    def __init__(
        self, env: tb.Env, namespace: str, topic: str, value: bytes, rate: float, *, partitions: int
    ) -> None:
        super().__init__(topic, value, rate)
        self._env = env
        self._namespace = namespace
        self._partitions = partitions

    def _run(self) -> None:
        asyncio.run(self._send())

    def _execute(self, txn: LocalTransaction, _arg: object) -> TxState:
        self.decided[txn.tx_id] = time.time()
        return TxState.COMMIT

    async def _send(self) -> None:
        env = self._env
        producer = AsyncTransactionProducer(
            env.bootstrap,
            f"bench-load-{env.run_id}",
            secret=env.secret,
            check=_commit,
            namespace=self._namespace,
            partitions=self._partitions,
            client_config=env.client,
        )
        async with producer:
            self._ready.set()
            pace = Pace(self.rate)
            for i in itertools.count():
                await asyncio.sleep(pace.delay())
                if self._stop.is_set():
                    return
                message = Message(self.topic, self.value, key=KEYS[i % len(KEYS)])
                result = await producer.send_in_transaction(message, self._execute)
                if result.state is TxState.COMMIT:
                    self.committed[result.tx_id] = time.time()
                acknowledged = "" if result.op_acknowledged else ", op not acknowledged"
                self.outcomes[f"{result.state.name}{acknowledged}"] += 1


def _commit(_txn: LocalTransaction) -> TxState:
    return TxState.COMMIT


class NativeLoad(Load):
    """One transactional producer: begin, produce one message, commit; again.

    A message's id is ``native-<n>``; the application committed it when it called
    ``commit_transaction``, and the commit was acknowledged when that call returned.
    """

    name = "native"

    def __init__(self, env: tb.Env, transactional_id: str, topic: str, value: bytes, rate: float) -> None:
        super().__init__(topic, value, rate)
        self._env = env
        self.transactional_id = transactional_id

    def _run(self) -> None:
        env = self._env
        producer = kafka.producer(
            env.bootstrap, env.extra, transactional_id=self.transactional_id, linger_ms=0
        )
        kafka.init_transactions(producer, 60)
        self._ready.set()
        pace = Pace(self.rate)
        for i in itertools.count():
            if self._stop.wait(pace.delay()):
                return
            tx = f"native-{i}"
            producer.begin_transaction()
            producer.produce(self.topic, self.value, KEYS[i % len(KEYS)], headers=[(H_TX, tx.encode())])
            self.decided[tx] = time.time()
            if self._commit(producer):
                self.committed[tx] = time.time()
                self.outcomes["COMMIT"] += 1

    def _commit(self, producer: Any, timeout: float = 120.0) -> bool:
        """Commit; retry what is retriable; abort what must be (False). A fatal error raises."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            except KafkaException as exc:
                error = exc.args[0]
                if error.txn_requires_abort():
                    self.outcomes[f"aborted ({error.name()})"] += 1
                    producer.abort_transaction(60)
                    return False
                if not error.retriable() or time.monotonic() > deadline:
                    raise
                self.outcomes[f"commit retried ({error.name()})"] += 1
            else:
                return True
