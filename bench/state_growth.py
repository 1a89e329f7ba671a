"""How long a takeover's read of one ``<ns>_state`` partition takes as positions records pile up.

Every commit appends a positions record to the ``<ns>_state`` partition of each partition it
covers, and a takeover reads the partition from its start (:func:`coordinator.commit.changelog.restore`).
Compaction drops superseded records from rolled segments only, so the segment size bounds
what the read meets. For each ``segment.bytes`` given (``default``: the broker's, 1 GiB), this
writes ``--records`` positions records into a fresh one-partition compacted topic, lets the
cleaner run for ``--settle`` seconds, and times the restore::

    python -m bench.state_growth --bootstrap 127.0.0.1:9092 --records 200000 default 4194304
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

from coordinator.commit import changelog
from txbridge import kafka
from txbridge.wire import POSITIONS_KEY, Positions


def _fill(bootstrap: str, topic: str, records: int, per_transaction: int) -> float:
    producer = kafka.producer(bootstrap, transactional_id=f"state-growth-{uuid.uuid4().hex[:8]}")
    kafka.init_transactions(producer, 30.0)
    started, position = time.perf_counter(), 1_000
    for first in range(0, records, per_transaction):
        producer.begin_transaction()
        for _ in range(min(per_transaction, records - first)):
            position += 8
            value = Positions(position, position, "txb1:3,5").encode()
            producer.produce(topic, value, key=POSITIONS_KEY, partition=0)
        producer.commit_transaction()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument(
        "--per-transaction", type=int, default=20, help="records per Kafka transaction (a commit writes 1)"
    )
    parser.add_argument("--settle", type=float, default=40.0, help="seconds for the cleaner before reading")
    parser.add_argument("segment_bytes", nargs="+", help="segment.bytes values, or 'default'")
    args = parser.parse_args(argv)
    for segment in args.segment_bytes:
        topic = f"state_growth_{uuid.uuid4().hex[:8]}"
        config = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
        if segment != "default":
            config["segment.bytes"] = segment
        kafka.ensure_topics(args.bootstrap, [kafka.TopicSpec(topic, 1, config)])
        wrote = _fill(args.bootstrap, topic, args.records, args.per_transaction)
        time.sleep(args.settle)
        started = time.perf_counter()
        read = changelog.restore(args.bootstrap, topic, [0], timeout=600)
        took = time.perf_counter() - started
        assert 0 in read.positions, "the positions record was not read back"
        print(
            f"segment.bytes={segment}: {args.records:,} positions records (written in {wrote:.0f} s), "
            f"{args.settle:.0f} s later a restore took {took:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
