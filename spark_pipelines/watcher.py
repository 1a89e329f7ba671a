"""Visibility watchers: when did each event first become readable?

For native Kafka transactions a record's timestamp is its append time, which
precedes its commit, so the record timestamp cannot say when a read_committed
consumer could see it. A watcher is a consumer (one per topic and isolation
level) polling from the start of the topic during the run; it records the wall
clock at which each order id was first returned. Commit-to-visible latency is
that time minus the order's DB commit time (same host clock).

RocketMQ has no topic Spark can read, so its watcher (:class:`RocketMQWatcher`) also
keeps every message it received, in order, and saves them for Spark.
"""

from __future__ import annotations

import csv
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spark_pipelines import schema
from spark_pipelines.latency_split import Republished
from txbridge import kafka
from txbridge.wire import H_TX, header_dict

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
        #: order id -> the first record's CreateTime and txbridge tx id ("" for other paths'
        #: records): with the op records' append times they split txbridge's latency
        #: (:mod:`spark_pipelines.latency_split`)
        self.first_record: dict[str, tuple[int, str]] = {}
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
        consumer = kafka.consumer(
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
                batch = kafka.consume_available(consumer, 500, 0.05)
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
                    if order_id not in self.first_seen:
                        self.first_seen[order_id] = seen_ms
                        tx_id = header_dict(msg.headers()).get(H_TX, b"").decode(errors="replace")
                        self.first_record[order_id] = (msg.timestamp()[1], tx_id)
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
            writer.writerow(["order_id", "first_seen_ms", "created_ms", "tx_id"])
            for order_id, seen_ms in sorted(self.first_seen.items()):
                writer.writerow([order_id, seen_ms, *self.first_record[order_id]])
        return target


def load_visibility(source: Path) -> dict[str, int]:
    """Read a file written by :meth:`VisibilityWatcher.save` (or :meth:`RocketMQWatcher.save`)."""
    with source.open(newline="") as handle:
        return {row["order_id"]: int(row["first_seen_ms"]) for row in csv.DictReader(handle)}


def load_republished(source: Path) -> dict[str, Republished]:
    """Order id -> what the watcher saw of its first record, from a :meth:`VisibilityWatcher.save`
    file of the txbridge topic (records without a txbridge tx id are left out)."""
    with source.open(newline="") as handle:
        return {
            row["order_id"]: Republished(int(row["first_seen_ms"]), int(row["created_ms"]), row["tx_id"])
            for row in csv.DictReader(handle)
            if row.get("tx_id")
        }


#: One record per message the RocketMQ watcher received, in the order received (Avro
#: container file, read by Spark with ``format("avro")``).
RECEIVED_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Received",
    "namespace": "txbridge.demo",
    "fields": [
        {"name": "seq", "type": "long", "doc": "0-based position in the order received"},
        {"name": "received_ms", "type": "long", "doc": "wall clock when receive() returned it"},
        {"name": "message_id", "type": "string"},
        {"name": "delivery_attempt", "type": "int", "doc": "1 for a first delivery"},
        {"name": "body", "type": "bytes", "doc": "the message body: an OrderCreated, bare Avro"},
    ],
}


@dataclass(frozen=True)
class Received:
    seq: int
    received_ms: int
    message_id: str
    delivery_attempt: int
    body: bytes


class RocketMQWatcher:
    """Record every message a RocketMQ consumer receives, and when.

    A ``SimpleConsumer`` of its own group, RocketMQ's consumer at its default
    (at-least-once) semantics: every message is recorded as received, then acked; a
    message delivered again (a failed ack, an invisible duration that ran out, the same
    transaction committed twice) is recorded again. Nothing is deduplicated here.

    Args:
        endpoint: the RocketMQ proxy's gRPC address.
        topic: the topic to subscribe to.
        group: the consumer group (created beforehand).
        await_s: long-polling wait of one receive (a message arriving meanwhile returns it at once).
        invisible_s: how long a received message stays invisible before it is delivered again.
    """

    def __init__(
        self, endpoint: str, topic: str, group: str, *, await_s: int = 2, invisible_s: int = 15
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.group = group
        self.await_s = await_s
        self.invisible_s = invisible_s
        self.received: list[Received] = []
        self.first_seen: dict[str, int] = {}
        self.undecodable = 0
        self.receive_errors = 0
        self.ack_errors = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def records(self) -> int:
        return len(self.received)

    def start(self, timeout: float = 60.0) -> RocketMQWatcher:
        """Start receiving; return once the proxy accepted a receive.

        The proxy answers the first ``receive()`` of a fresh consumer with an internal
        error (for a second or two on a fresh proxy); the watcher retries until one is
        accepted, so it is really receiving before the first order is sent.

        Raises:
            RuntimeError: no receive was accepted within ``timeout`` seconds, or the consumer
                could not start.
        """
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.topic}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2) and self._thread.is_alive() and time.monotonic() < deadline:
            pass
        if not self._ready.is_set():
            self._stop.set()
            cause = f": {self._error}" if self._error else ""
            raise RuntimeError(
                f"RocketMQ watcher of {self.topic} could not receive within {timeout:.0f}s{cause} "
                f"(RocketMQ at {self.endpoint})"
            )
        return self

    def _run(self) -> None:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

        config = ClientConfiguration(self.endpoint, Credentials(), request_timeout=10)
        consumer = SimpleConsumer(
            config, self.group, {self.topic: FilterExpression()}, await_duration=self.await_s
        )
        try:
            consumer.startup()
        except BaseException as exc:
            self._error = exc
            return
        try:
            while not self._stop.is_set():
                try:
                    messages = self._receive(consumer)
                except Exception as exc:  # the client raises its own and gRPC errors; retried
                    self.receive_errors += 1
                    logger.debug("receive from %s failed (retrying): %s", self.topic, exc)
                    self._stop.wait(0.5)
                    continue
                self._ready.set()
                for message in messages:
                    self._record(message)
                    try:
                        consumer.ack(message)
                    except Exception as exc:  # delivered again after invisible_s: recorded again
                        self.ack_errors += 1
                        logger.warning("ack of %s failed: %s", message.message_id, exc)
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
        finally:
            consumer.shutdown()

    def _receive(self, consumer: Any) -> list[Any]:
        """One receive. A refused one fails at once; one still open after a second is a
        long poll the proxy accepted, which returns any message that arrives meanwhile: the
        watcher counts as started then, not when an empty poll ends (seconds later)."""
        future = consumer.receive_async(32, self.invisible_s)
        if not self._ready.is_set():
            try:
                return list(future.result(timeout=1.0))
            except FutureTimeout:
                self._ready.set()
        return list(future.result())

    def _record(self, message: Any) -> None:
        seen_ms = int(time.time() * 1000)
        body = bytes(message.body or b"")
        self.received.append(
            Received(
                len(self.received), seen_ms, str(message.message_id), int(message.delivery_attempt or 1), body
            )
        )
        try:
            order_id = schema.decode(body).order_id
        except ValueError:
            self.undecodable += 1
            return
        self.first_seen.setdefault(order_id, seen_ms)

    def stop(self) -> None:
        """Stop receiving (within one long-polling wait).

        Raises:
            RuntimeError: the watcher died during the run.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.await_s + 30)
        if self._error is not None:
            raise RuntimeError(f"RocketMQ watcher of {self.topic} failed") from self._error

    def save(self, target: Path) -> Path:
        """Write :attr:`first_seen` as :meth:`VisibilityWatcher.save` does."""
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["order_id", "first_seen_ms"])
            writer.writerows(sorted(self.first_seen.items()))
        return target

    def save_received(self, target: Path) -> Path:
        """Write every received message, in order, as an Avro container file (:data:`RECEIVED_SCHEMA`)."""
        import fastavro

        with target.open("wb") as handle:
            fastavro.writer(
                handle, fastavro.parse_schema(RECEIVED_SCHEMA), [asdict(r) for r in self.received]
            )
        return target


def load_received(source: Path) -> list[Received]:
    """Read a file written by :meth:`RocketMQWatcher.save_received`."""
    import fastavro

    with source.open("rb") as handle:
        return [Received(**record) for record in fastavro.reader(handle)]  # type: ignore[arg-type]
