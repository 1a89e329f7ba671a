"""What a Kafka transaction's shape costs: where a commit could carry its partitions' positions.

The coordinator's commit carries republished records and, for every partition it covers, a
positions record in that partition's ``<ns>_state`` partition: about 11 more partitions in the
transaction at half load, each added, produced to and given a marker. This compares, at one
cadence and record count, alternated in blocks on one broker:

- ``state``: the records plus one small record in each of ``--state-partitions`` partitions of a
  compacted topic (the coordinator's shape now);
- ``offsets``: the records plus ``send_offsets_to_transaction`` for ``--offset-partitions``
  partitions with metadata, for a group with no members (KIP-447's shape: the positions in a
  group's committed offsets, one ``__consumer_offsets`` partition);
- ``state1``: the records plus one record in one partition (the least any record-based shape adds);
- ``none``: the records alone.

Each transaction is timed from its last republished record's ``produce`` to the end of
``commit_transaction`` (the positions step, the flush, the EndTxn), and the broker's CPU is
read around each block (:class:`bench.kafka_native.CpuMeter`). Run it beside a local broker::

    python -m bench.txn_shape --bootstrap 127.0.0.1:9092 --broker-pid "$(pgrep -f kafka.Kafka)"

``--verification on,off`` runs every block of every shape once under each value of the brokers'
``transaction.partition.verification.enable`` (KIP-890's check, on by default since Kafka 3.6:
a partition leader asks the transaction coordinator whether a transactional produce's partition
is in its transaction before it appends the first batch of each transaction), set as a dynamic
setting of every broker and deleted again at the end. It tells how much of a partition's cost is
that check's round trip. Only on a broker of your own: while it is off, a late produce can
leave a transaction hanging.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.kafka_native import CpuMeter
from txbridge import kafka
from txbridge.kafka import TopicPartition

SHAPES = ("state", "offsets", "state1", "none")
#: The brokers' setting ``--verification`` alternates (KIP-890's partition verification).
VERIFICATION = "transaction.partition.verification.enable"


@dataclass
class _Timings:
    positions: list[float] = field(default_factory=list)
    flush: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    broker_cpu_s: float = 0.0

    def line(self, shape: str) -> str:
        def ms(values: list[float], decile: int | None = None) -> str:
            if decile is None:
                return f"{statistics.median(values) * 1e3:.2f}"
            value = statistics.quantiles(values, n=10)[decile]
            return f"{value * 1e3:.2f}"

        return (
            f"{shape:22s} total p50 {ms(self.total)} p90 {ms(self.total, 8)} ms"
            f" (positions {ms(self.positions)}, flush {ms(self.flush)}, EndTxn {ms(self.end)})"
            f" | broker CPU {self.broker_cpu_s / len(self.total) * 1e3:.2f} ms per transaction"
        )


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--broker-pid", type=int, required=True, help="the broker's pid, for its CPU")
    parser.add_argument("--shapes", default="state,offsets,state1,none")
    parser.add_argument("--blocks", type=int, default=3, help="rounds of every shape, alternated")
    parser.add_argument("--commits", type=int, default=250, help="transactions per shape per block")
    parser.add_argument("--period-ms", type=float, default=20.0, help="one transaction begun every ...")
    parser.add_argument("--records", type=int, default=96, help="republished records per transaction")
    parser.add_argument("--record-partitions", type=int, default=6)
    parser.add_argument("--state-partitions", type=int, default=11)
    parser.add_argument("--offset-partitions", type=int, default=24)
    parser.add_argument(
        "--verification",
        default="",
        help=f"on,off: every shape under each value of the brokers' {VERIFICATION} (default: as set)",
    )
    args = parser.parse_args(argv)
    args.shapes = args.shapes.split(",")
    if unknown := set(args.shapes) - set(SHAPES):
        parser.error(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")
    args.verification = args.verification.split(",") if args.verification else [None]
    if unknown := set(args.verification) - {"on", "off", None}:
        parser.error(f"--verification takes on and off, not {sorted(unknown)}")
    return args


def _set_verification(bootstrap: str, value: str | None) -> None:
    """The brokers' partition verification on or off (None: back to the brokers' own)."""
    kafka.set_cluster_setting(bootstrap, VERIFICATION, None if value is None else str(value == "on").lower())


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    shapes = args.shapes

    tag = uuid.uuid4().hex[:8]
    out, state, source = f"shape_out_{tag}", f"shape_state_{tag}", f"shape_in_{tag}"
    kafka.ensure_topics(
        args.bootstrap,
        [
            kafka.TopicSpec(out, args.record_partitions),
            kafka.TopicSpec(state, args.state_partitions, {"cleanup.policy": "compact"}),
            kafka.TopicSpec(source, args.offset_partitions),
        ],
    )
    group_metadata = kafka.consumer(args.bootstrap, f"shape-positions-{tag}").consumer_group_metadata()
    producers = {}
    for shape in shapes:
        producers[shape] = kafka.producer(args.bootstrap, transactional_id=f"shape-{shape}-{tag}")
        kafka.init_transactions(producers[shape], 30.0)

    value, positions = b"x" * 200, "txb1:" + ",".join(str(n) for n in range(60))[:195]
    offset = 0

    def positions_of(shape: str) -> Callable[[kafka.Producer], None]:
        def records(producer: kafka.Producer, partitions: int) -> None:
            for partition in range(partitions):
                producer.produce(state, positions.encode(), key=b"\x00positions", partition=partition)

        def offsets(producer: kafka.Producer) -> None:
            producer.send_offsets_to_transaction(
                [TopicPartition(source, p, offset, positions) for p in range(args.offset_partitions)],
                group_metadata,
            )

        return {
            "state": lambda producer: records(producer, args.state_partitions),
            "state1": lambda producer: records(producer, 1),
            "offsets": offsets,
            "none": lambda producer: None,
        }[shape]

    broker = CpuMeter({"broker": args.broker_pid})
    runs = [(shape, verification) for verification in args.verification for shape in shapes]
    timings = {run: _Timings() for run in runs}
    try:
        for block in range(args.blocks):
            for verification in args.verification:
                if verification is not None:
                    _set_verification(args.bootstrap, verification)
                for shape, producer in producers.items():
                    timing = timings[shape, verification]
                    add_positions = positions_of(shape)
                    broker.start()
                    due = time.perf_counter()
                    for _ in range(args.commits):
                        due += args.period_ms / 1e3
                        producer.begin_transaction()
                        for n in range(args.records):
                            producer.produce(out, value, partition=n % args.record_partitions)
                        offset += 10
                        started = time.perf_counter()
                        add_positions(producer)
                        produced = time.perf_counter()
                        producer.flush()
                        flushed = time.perf_counter()
                        producer.commit_transaction()
                        ended = time.perf_counter()
                        timing.positions.append(produced - started)
                        timing.flush.append(flushed - produced)
                        timing.end.append(ended - flushed)
                        timing.total.append(ended - started)
                        time.sleep(max(0.0, due - time.perf_counter()))
                    timing.broker_cpu_s += broker.per_message(1).get("broker_cpu_us_per_msg", 0.0) / 1e6
            print(f"block {block + 1} of {args.blocks} done", flush=True)
    finally:
        if args.verification != [None]:
            _set_verification(args.bootstrap, None)
    for shape, verification in runs:
        label = shape if verification is None else f"{shape}, verification {verification}"
        print(timings[shape, verification].line(label))


if __name__ == "__main__":
    main()
