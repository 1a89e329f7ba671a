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

Every transaction's result is one JSON line in ``--out`` (tx id, key, seq, message count,
the state the SDK reported, whether the op was acknowledged, the error, start and end wall
times). After the last one it writes ``{"done": ...}`` and keeps serving back-checks until
its stdin closes; then it closes the producer and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from txbridge import LocalTransaction, Message, SqliteBarrier, TransactionProducer, TxState
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


def _execute(barrier: SqliteBarrier, seq: int) -> Any:
    def execute(txn: LocalTransaction, _arg: Any) -> TxState:
        if seq % 10 == 7:
            return TxState.ROLLBACK
        if seq % 20 == 19:
            raise LocalFailure(f"seq {seq} failed before its local commit")
        with barrier.local_transaction(txn.tx_id) as conn:
            conn.execute("INSERT INTO orders (tx_id, seq) VALUES (?, ?)", (txn.tx_id, seq))
        return TxState.UNKNOWN if seq % 10 == 8 else TxState.COMMIT

    return execute


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


def run_thread(
    producer: TransactionProducer,
    barrier: SqliteBarrier,
    recorder: Recorder,
    opts: argparse.Namespace,
    thread: int,
) -> None:
    interval = 1.0 / opts.rate if opts.rate > 0 else 0.0
    next_start = time.monotonic()
    for seq in range(opts.transactions):
        # Paced without catching up: after a stall the thread goes on at its rate, not in a burst.
        time.sleep(max(0.0, next_start - time.monotonic()))
        next_start = max(next_start + interval, time.monotonic())
        key = key_of(opts.index, thread, seq)
        batch = [
            Message(opts.topic, value_of(opts.index, thread, seq, n).encode(), key=key.encode())
            for n in range(messages_in(seq))
        ]
        record: dict[str, Any] = {"thread": thread, "seq": seq, "key": key, "messages": len(batch)}
        record["start"] = time.time()
        try:
            result = producer.send_in_transaction(batch, _execute(barrier, seq))
        except Exception as exc:  # nothing was written (docs/producer.md): on record, and go on
            record.update(tx=None, state=None, op_ack=False, error=f"raised {exc!r}", end=time.time())
            recorder.write(record)
            continue
        record.update(
            tx=result.tx_id,
            state=result.state.value,
            op_ack=result.op_acknowledged,
            error=repr(result.error) if result.error is not None else None,
            end=time.time(),
        )
        recorder.write(record)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "command-config", "namespace", "topic", "db", "out"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("partitions", "index", "threads", "transactions"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="transactions per second per thread")
    opts = parser.parse_args(argv)
    # The SDK's warnings (retries, failed writes) go to this process's log for the test to show.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with sqlite3.connect(opts.db) as db:
        db.execute("CREATE TABLE IF NOT EXISTS orders (tx_id TEXT PRIMARY KEY, seq INTEGER)")
    barrier = SqliteBarrier(opts.db)
    producer = TransactionProducer(
        opts.bootstrap,
        f"chaos-{opts.namespace}",
        secret=os.environ[SECRET_ENV],
        check=barrier.check,
        namespace=opts.namespace,
        partitions=opts.partitions,
        instance_id=f"producer-{opts.index}",
        client_config=ClientConfig.load(opts.command_config),
    )
    with Path(opts.out).open("a") as out:
        recorder = Recorder(out)
        producer.start()
        threads = [
            threading.Thread(target=run_thread, args=(producer, barrier, recorder, opts, t), daemon=True)
            for t in range(opts.threads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        recorder.write({"done": time.time()})
        sys.stdin.read()  # serve back-checks until the test closes our stdin
        producer.close()


if __name__ == "__main__":
    main()
