"""Visibility watchers: when did each event first become readable?

For native Kafka transactions a record's timestamp is its append time, which
precedes its commit, so the record timestamp cannot say when a read_committed
consumer could see it. A watcher is a consumer (one per topic and isolation
level) polling from the start of the topic during the run; it records the wall
clock at which each order id was first returned. Commit-to-visible latency is
that time minus the order's DB commit time (same host clock).
"""

from __future__ import annotations

import csv
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_pipelines import schema
from txbridge import _kafka

logger = logging.getLogger(__name__)


class VisibilityWatcher:
    """Record the first-seen wall time (ms) of every order id on ``topic``."""

    def __init__(
        self, bootstrap: str, topic: str, isolation: str, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        self.topic = topic
        self.isolation = isolation
        self.first_seen: dict[str, int] = {}
        self.records = 0
        self.undecodable = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._assigned = threading.Event()

    def start(self, timeout: float = 60.0) -> VisibilityWatcher:
        """Start polling; return once the consumer holds its partitions.

        Raises:
            RuntimeError: no assignment within ``timeout`` seconds.
        """
        self._thread = threading.Thread(
            target=self._run, name=f"watch-{self.topic}-{self.isolation}", daemon=True
        )
        self._thread.start()
        if not self._assigned.wait(timeout):
            self._stop.set()
            raise RuntimeError(f"watcher of {self.topic} got no partitions within {timeout:.0f}s")
        return self

    def _run(self) -> None:
        consumer = _kafka.consumer(
            self.bootstrap,
            f"watcher-{uuid.uuid4().hex[:8]}",
            self.extra,
            isolation_level=self.isolation,
            fetch_wait_max_ms=10,
            topic_metadata_refresh_interval_ms=1000,
        )
        try:
            consumer.subscribe([self.topic])
            while not self._stop.is_set():
                batch = _kafka.consume_available(consumer, 500, 0.05)
                if not self._assigned.is_set() and consumer.assignment():
                    self._assigned.set()
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    seen_ms = int(time.time() * 1000)
                    self.records += 1
                    try:
                        order_id = schema.decode(msg.value() or b"").order_id
                    except ValueError:
                        self.undecodable += 1
                        continue
                    self.first_seen.setdefault(order_id, seen_ms)
        except BaseException as exc:  # surfaced by stop(); a dead watcher must not pass silently
            self._error = exc
        finally:
            consumer.close()

    def seen(self, order_ids: set[str]) -> bool:
        return order_ids.issubset(self.first_seen)

    def stop(self) -> None:
        """Stop polling.

        Raises:
            RuntimeError: the watcher died during the run.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._error is not None:
            raise RuntimeError(f"watcher of {self.topic} ({self.isolation}) failed") from self._error

    def save(self, target: Path) -> Path:
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["order_id", "first_seen_ms"])
            writer.writerows(sorted(self.first_seen.items()))
        return target


def load_visibility(source: Path) -> dict[str, int]:
    """Read a file written by :meth:`VisibilityWatcher.save`."""
    with source.open(newline="") as handle:
        return {row["order_id"]: int(row["first_seen_ms"]) for row in csv.DictReader(handle)}
