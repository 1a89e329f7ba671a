"""A consumer process for the crash tests: logs every processed message, stops cleanly on SIGTERM.

Usage: ``python -m tests.consumers.crash_worker BOOTSTRAP GROUP TOPIC orderly|concurrent LOG RUN``.
Each processed message appends ``RUN KEY SEQ`` to LOG with one unbuffered write,
so the log survives a SIGKILL exactly up to the last processed message.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from txbridge.consumer import (
    ConcurrentConsumer,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
)

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def main() -> int:
    bootstrap, group, topic, kind, log_path, run = sys.argv[1:7]
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def record(message: Any) -> None:
        key, seq = message.value.decode().split(":")
        time.sleep(0.02)  # some work, so a kill lands mid-stream
        os.write(fd, f"{run} {key} {seq}\n".encode())

    consumer: OrderlyConsumer | ConcurrentConsumer
    if kind == "orderly":

        def orderly(message: Any, _context: Any) -> ConsumeOrderlyStatus:
            record(message)
            return ConsumeOrderlyStatus.SUCCESS

        consumer = OrderlyConsumer(bootstrap, group, topic, orderly, extra_config=FAST_GROUP)
    else:

        def concurrent(message: Any, _context: Any) -> ConsumeConcurrentlyStatus:
            record(message)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = ConcurrentConsumer(bootstrap, group, topic, concurrent, workers=4, extra_config=FAST_GROUP)
    consumer.run(stop)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
