"""A producer that dies by SIGKILL between its half records and its op record.

For crash tests (here and the coordinator's end-to-end ones)::

    python -m tests.producer.crash_producer --bootstrap B --namespace NS --partitions N \\
        --group G --db orders.db --topic orders --secret S --when after-local-commit

It prints ``tx=<tx id>`` (flushed), then kills itself: ``after-local-commit`` once the
order and the barrier row are committed in SQLite, ``before-local-commit`` before
touching the database. Either way the half records are in Kafka and no op record is.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
from typing import Any

from txbridge import LocalTransaction, Message, SqliteBarrier, TransactionProducer, TxState


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "namespace", "group", "db", "topic", "secret"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--when", choices=["after-local-commit", "before-local-commit"], required=True)
    opts = parser.parse_args(argv)
    with sqlite3.connect(opts.db) as db:
        db.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")
    barrier = SqliteBarrier(opts.db)

    def execute(txn: LocalTransaction, arg: Any) -> TxState:
        sys.stdout.write(f"tx={txn.tx_id}\n")
        sys.stdout.flush()
        if opts.when == "after-local-commit":
            with barrier.local_transaction(txn.tx_id) as conn:
                conn.execute("INSERT INTO orders (id) VALUES (?)", (txn.tx_id,))
        os.kill(os.getpid(), signal.SIGKILL)
        return TxState.COMMIT  # never reached

    producer = TransactionProducer(
        opts.bootstrap,
        opts.group,
        secret=opts.secret,
        check=barrier.check,
        namespace=opts.namespace,
        partitions=opts.partitions,
    )
    producer.start()
    producer.send_in_transaction(Message(opts.topic, b"order", key=b"customer-1"), execute)


if __name__ == "__main__":
    main()
