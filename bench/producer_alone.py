"""The asyncio producer alone: its CPU per transaction, with no coordinator competing for the box.

``python -m bench.producer_alone [--bootstrap 127.0.0.1:9092] [--count 40000] [--rounds 3]``

One :class:`~txbridge.aio.AsyncTransactionProducer` sends one-message transactions (512
bytes, ``--in-flight`` at once, every local transaction answering COMMIT), as the producer
process of ``txbridge bench``'s e2e step does; the process's CPU (every thread: the event
loop, the delivery threads, librdkafka's) over the counted transactions, divided by their
number. Nothing republishes them: a fresh namespace is made and deleted. Run two checkouts
alternately (``cd`` into each; ``python -m`` takes the current directory's code) to compare
them: the e2e step's producer CPU also moves with whatever else the box runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from tempfile import mkdtemp

from bench.kafka_native import payload
from bench.txbridge_runs import Env, _always, _send_many
from txbridge import Message, TxState


async def _rounds(env: Env, ns: str, topic: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    producer = env.producer(ns, "producer-alone", lambda _t: TxState.COMMIT)
    await producer.start()
    value = payload(args.size)

    def messages(count: int) -> list[Message]:
        return [Message(topic, value, key=str(i % 4096).encode()) for i in range(count)]

    try:
        await _send_many(producer, messages(args.warmup), args.in_flight, _always(TxState.COMMIT), {})
        figures = []
        for _ in range(args.rounds):
            batch = messages(args.count)  # made before the clock starts: the application's cost
            cpu, started = time.process_time(), time.perf_counter()
            await _send_many(producer, batch, args.in_flight, _always(TxState.COMMIT), {})
            seconds = time.perf_counter() - started
            figures.append((args.count / seconds, (time.process_time() - cpu) / args.count * 1e6))
        return figures
    finally:
        await producer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.producer_alone", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--count", type=int, default=40_000, help="transactions per counted round")
    parser.add_argument("--warmup", type=int, default=5_000, help="transactions before the first round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args(argv)
    env = Env(args.bootstrap, os.urandom(4).hex(), Path(mkdtemp(prefix="txbridge-producer-alone-")))
    try:
        ns, topic = env.namespace("alone"), env.topic("alone")
        figures = asyncio.run(_rounds(env, ns, topic, args))
    finally:
        env.delete_topics()
    for rate, cpu in figures:
        print(f"{os.getcwd()}: {rate:,.0f} transactions/s, {cpu:.1f} µs of the process's CPU per transaction")


if __name__ == "__main__":
    main()
