"""One SDK producer process of the broker-chaos test: keyed transactions, each outcome on record.

Run as::

    TXBRIDGE_CHAOS_SECRET=S python -m tests.secure.chaos_producer --bootstrap B --command-config F \\
        --namespace NS --partitions N --topic T --index 0 --threads 4 --transactions 250 \\
        --rate 4 --db p0.db --out p0.jsonl

Each of ``--threads`` threads owns its keys (``p<index>t<thread>k<j>``) and sends
``--transactions`` transactions one after another (at most ``--rate`` per second), so a
key's commit order is the thread's order. The local transaction is a SqliteBarrier row
(a decisive check: an UNKNOWN is settled by the producer itself, and the coordinator's
back-check gets the same answer). The mix, by sequence number:

    seq % 10 == 7   ROLLBACK, nothing written locally
    seq % 10 == 8   local commit, then UNKNOWN (as if the answer was lost): settled COMMIT
    seq % 20 == 19  raises before the local commit: settled ROLLBACK
    otherwise       local commit, COMMIT

With ``--work-ms``, a local transaction works a random while before its commit and another
after it (up to the value in all), as a service's does: a producer SIGKILLed at a random
moment then often finds one in flight, before or after its local commit.

Every transaction's result is one JSON line in ``--out`` (tx id, key, seq, message count,
the state the SDK reported, whether the op was acknowledged, the error, start and end wall
times). Before that, once its half records are written, the local transaction puts
``{"begun": {thread, seq, tx, messages}}`` on record: a process killed before the result
leaves the transaction in doubt, and its barrier row (or the check's) decides it. After the
last one it writes ``{"done": ...}`` and keeps serving back-checks until its stdin closes;
then it closes the producer and exits.

With ``--stop-file``, each thread stops sending once that file exists (a load that lasts
as long as something else does, e.g. a fault schedule), at most ``--transactions`` each.

A process started again on the same ``--out`` and ``--db`` (after a SIGKILL) goes on where
the last one stopped: each thread from the seq after the last one on record, under the same
instance id, so it also answers the back-checks of the transactions its predecessor left.
Each process has its own database. With ``--group`` several processes are instances of one
group, each on its own database (the README's barrier on two hosts): a killed one's
transactions must then wait for it, never be answered by another's barrier. Without it each
process is a group of its own (``chaos-<namespace>-<index>``).

With ``--asyncio`` the process runs :class:`AsyncTransactionProducer` instead, each "thread"
a task of one event loop (the local transaction's work awaited): its transactions that decide
in one turn of the loop share an op record (a batch), which faults must not break either.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from txbridge import (
    AsyncTransactionProducer,
    LocalTransaction,
    Message,
    SqliteBarrier,
    TransactionProducer,
    TxState,
)
from txbridge.client_config import ClientConfig

SECRET_ENV = "TXBRIDGE_CHAOS_SECRET"  # noqa: S105 - the name of the variable, not a secret
KEYS_PER_THREAD = 5


def key_of(index: int, thread: int, seq: int) -> str:
    return f"p{index}t{thread}k{seq % KEYS_PER_THREAD}"


def value_of(index: int, thread: int, seq: int, n: int) -> str:
    """The republished value names the transaction's sender and place: the reader maps it back."""
    return f"{index}/{thread}/{seq}/{n}"


def messages_in(seq: int) -> int:
    return 2 if seq % 3 == 0 else 1


class LocalFailure(Exception):
    """The local transaction failed before committing (the callback raised)."""


class Recorder:
    """Appends one JSON line per event to the outcome file, flushed at once (the test tails it)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()


def _local(barrier: SqliteBarrier, seq: int, txn: LocalTransaction) -> TxState:
    """The mix (module docstring): ROLLBACK with nothing written, a failure, or the barrier row
    written and COMMIT (or UNKNOWN, as if the answer was lost)."""
    if seq % 10 == 7:
        return TxState.ROLLBACK
    if seq % 20 == 19:
        raise LocalFailure(f"seq {seq} failed before its local commit")
    with barrier.local_transaction(txn.tx_id) as conn:
        conn.execute("INSERT INTO orders (tx_id, seq) VALUES (?, ?)", (txn.tx_id, seq))
    return TxState.UNKNOWN if seq % 10 == 8 else TxState.COMMIT


def _execute(barrier: SqliteBarrier, recorder: Recorder, begun: dict[str, Any], work_s: float) -> Any:
    seq = begun["seq"]

    def execute(txn: LocalTransaction, _arg: Any) -> TxState:
        recorder.write({"begun": {**begun, "tx": txn.tx_id}})
        before = random.uniform(0.0, work_s)
        time.sleep(before)
        state = _local(barrier, seq, txn)
        if state is not TxState.ROLLBACK:
            time.sleep(work_s - before)
        return state

    return execute


def _execute_async(barrier: SqliteBarrier, recorder: Recorder, begun: dict[str, Any], work_s: float) -> Any:
    """:func:`_execute` for the asyncio producer: the same mix, its work awaited."""
    seq = begun["seq"]

    async def execute(txn: LocalTransaction, _arg: Any) -> TxState:
        recorder.write({"begun": {**begun, "tx": txn.tx_id}})
        before = random.uniform(0.0, work_s)
        await asyncio.sleep(before)
        state = _local(barrier, seq, txn)
        if state is not TxState.ROLLBACK:
            await asyncio.sleep(work_s - before)
        return state

    return execute


class _Pace:
    """A thread's (or task's) pace: at most ``--rate`` per second, without catching up after a
    stall (it goes on at its rate, not in a burst), until ``--stop-file`` exists."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self._interval = 1.0 / opts.rate if opts.rate > 0 else 0.0
        self._next = time.monotonic()
        self._stop = Path(opts.stop_file) if opts.stop_file else None

    def wait_s(self) -> float:
        """How long to sleep before the next transaction."""
        return max(0.0, self._next - time.monotonic())

    def go_on(self) -> bool:
        """After that sleep: whether to send the next one."""
        self._next = max(self._next + self._interval, time.monotonic())
        return self._stop is None or not self._stop.exists()


def _batch(opts: argparse.Namespace, thread: int, seq: int) -> tuple[list[Message], dict[str, Any]]:
    key = key_of(opts.index, thread, seq)
    batch = [
        Message(opts.topic, value_of(opts.index, thread, seq, n).encode(), key=key.encode())
        for n in range(messages_in(seq))
    ]
    return batch, {"thread": thread, "seq": seq, "key": key, "messages": len(batch), "start": time.time()}


def _record_result(recorder: Recorder, record: dict[str, Any], result: Any) -> None:
    record.update(
        tx=result.tx_id,
        state=result.state.value,
        op_ack=result.op_acknowledged,
        error=repr(result.error) if result.error is not None else None,
        end=time.time(),
    )
    recorder.write(record)


def _record_raised(recorder: Recorder, record: dict[str, Any], exc: Exception) -> None:
    # nothing was written (docs/producer.md): on record, and go on
    record.update(tx=None, state=None, op_ack=False, error=f"raised {exc!r}", end=time.time())
    recorder.write(record)


async def run_task(
    producer: AsyncTransactionProducer,
    barrier: SqliteBarrier,
    recorder: Recorder,
    opts: argparse.Namespace,
    thread: int,
    *,
    first: int,
) -> None:
    """:func:`run_thread` as a task of the asyncio producer's loop."""
    pace = _Pace(opts)
    for seq in range(first, opts.transactions):
        await asyncio.sleep(pace.wait_s())
        if not pace.go_on():
            break
        batch, record = _batch(opts, thread, seq)
        begun = {"thread": thread, "seq": seq, "messages": len(batch)}
        try:
            execute = _execute_async(barrier, recorder, begun, opts.work_ms / 1000)
            result = await producer.send_in_transaction(batch, execute)
        except Exception as exc:
            _record_raised(recorder, record, exc)
            continue
        _record_result(recorder, record, result)


def run_thread(
    producer: TransactionProducer,
    barrier: SqliteBarrier,
    recorder: Recorder,
    opts: argparse.Namespace,
    thread: int,
    *,
    first: int,
) -> None:
    pace = _Pace(opts)
    for seq in range(first, opts.transactions):
        time.sleep(pace.wait_s())
        if not pace.go_on():
            break
        batch, record = _batch(opts, thread, seq)
        begun = {"thread": thread, "seq": seq, "messages": len(batch)}
        try:
            execute = _execute(barrier, recorder, begun, opts.work_ms / 1000)
            result = producer.send_in_transaction(batch, execute)
        except Exception as exc:
            _record_raised(recorder, record, exc)
            continue
        _record_result(recorder, record, result)


def resume_points(out: Path, threads: int) -> list[int]:
    """Each thread's first seq not yet on record in ``out`` (0 for a fresh file)."""
    first = [0] * threads
    text = out.read_text() if out.exists() else ""
    for line in text.split("\n")[:-1]:  # whole lines: a SIGKILL may have cut the last one
        if not line:
            continue
        record = json.loads(line)
        record = record.get("begun", record)
        if "seq" in record:
            first[record["thread"]] = max(first[record["thread"]], record["seq"] + 1)
    return first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "command-config", "namespace", "topic", "db", "out"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("partitions", "index", "threads", "transactions"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="transactions per second per thread")
    parser.add_argument("--work-ms", type=float, default=0.0, help="each local transaction's work")
    parser.add_argument("--stop-file", help="stop sending once this file exists")
    parser.add_argument("--group", help="the producer group (default: one of its own)")
    parser.add_argument("--asyncio", action="store_true", help="run AsyncTransactionProducer")
    opts = parser.parse_args(argv)
    # The SDK's warnings (retries, failed writes) go to this process's log for the test to show.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with sqlite3.connect(opts.db) as db:
        db.execute("CREATE TABLE IF NOT EXISTS orders (tx_id TEXT PRIMARY KEY, seq INTEGER)")
    barrier = SqliteBarrier(opts.db)
    options: dict[str, Any] = {
        "secret": os.environ[SECRET_ENV],
        "check": barrier.check,
        "namespace": opts.namespace,
        "partitions": opts.partitions,
        "instance_id": f"producer-{opts.index}",
        "client_config": ClientConfig.load(opts.command_config),
    }
    group = opts.group or f"chaos-{opts.namespace}-{opts.index}"
    first = resume_points(Path(opts.out), opts.threads)
    with Path(opts.out).open("a") as out:
        if out.tell() and not Path(opts.out).read_text().endswith("\n"):
            out.write("\n")  # the line a SIGKILL cut stays alone on its line
        recorder = Recorder(out)
        if opts.asyncio:
            asyncio.run(
                _main_async(
                    AsyncTransactionProducer(opts.bootstrap, group, **options), barrier, recorder, opts, first
                )
            )
            return
        producer = TransactionProducer(opts.bootstrap, group, **options)
        producer.start()
        threads = [
            threading.Thread(
                target=run_thread,
                args=(producer, barrier, recorder, opts, t),
                kwargs={"first": first[t]},
                daemon=True,
            )
            for t in range(opts.threads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        recorder.write({"done": time.time()})
        sys.stdin.read()  # serve back-checks until the test closes our stdin
        producer.close()


async def _main_async(
    producer: AsyncTransactionProducer,
    barrier: SqliteBarrier,
    recorder: Recorder,
    opts: argparse.Namespace,
    first: list[int],
) -> None:
    await producer.start()
    await asyncio.gather(
        *(run_task(producer, barrier, recorder, opts, t, first=first[t]) for t in range(opts.threads))
    )
    recorder.write({"done": time.time()})
    await asyncio.to_thread(sys.stdin.read)  # serve back-checks until the test closes our stdin
    await producer.close()


if __name__ == "__main__":
    main()
