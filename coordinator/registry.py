"""Live producer instances, from ``<ns>_producers``.

Every coordinator reads the whole registry with ``assign`` (it is not one of the
group's partitions). An instance is live until ``liveness_s`` after the broker's
append time of its last heartbeat; a tombstone means it left.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txbridge import _kafka
from txbridge.errors import WireFormatError
from txbridge.wire import ProducerInstance, decode_producer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Heartbeat:
    url: str
    seen_ms: int  # broker append time (coordinator clock when the topic keeps CreateTime)


class RegistryView:
    """The registry's content: pure, fed with records."""

    def __init__(self, liveness_s: float) -> None:
        self.liveness_ms = int(liveness_s * 1000)
        self._instances: dict[tuple[str, str], Heartbeat] = {}

    def apply(self, key: bytes | None, value: bytes | None, seen_ms: int) -> None:
        """One registry record. Raises WireFormatError for a value that is not a heartbeat."""
        if value is None:
            group, _, instance = (key or b"").decode("utf-8", "replace").partition("/")
            self._instances.pop((group, instance), None)
            return
        beat: ProducerInstance = decode_producer(value)
        current = self._instances.get((beat.group, beat.instance))
        if current is None or current.seen_ms <= seen_ms:
            self._instances[(beat.group, beat.instance)] = Heartbeat(beat.url, seen_ms)

    def targets(self, group: str, instance: str, now_ms: int) -> list[str]:
        """Check URLs to try: the originating instance first if live, then the group's other live ones."""
        live = {
            inst: beat.url
            for (grp, inst), beat in self._instances.items()
            if grp == group and now_ms - beat.seen_ms <= self.liveness_ms
        }
        first = [live.pop(instance)] if instance in live else []
        return first + [live[name] for name in sorted(live)]

    def live(self, now_ms: int) -> set[tuple[str, str]]:
        """The (group, instance) pairs live at ``now_ms``."""
        return {key for key, beat in self._instances.items() if now_ms - beat.seen_ms <= self.liveness_ms}

    def __len__(self) -> int:
        return len(self._instances)


class ProducerRegistry:
    """Reads ``<ns>_producers`` into a :class:`RegistryView`; call :meth:`poll` from the loop."""

    def __init__(
        self, bootstrap: str, topic: str, liveness_s: float, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.view = RegistryView(liveness_s)
        self.caught_up = False
        self._bootstrap, self._topic, self._extra = bootstrap, topic, extra
        self._consumer: Any = None
        self.malformed = 0

    def start(self) -> None:
        # A throwaway group id: this consumer never commits, it re-reads the compacted topic.
        self._consumer = _kafka.consumer(
            self._bootstrap,
            f"txbridge-registry-{uuid.uuid4().hex[:8]}",
            self._extra,
            enable_partition_eof=True,
        )
        self._consumer.assign([_kafka.partition_at(self._topic, 0, _kafka.FROM_START)])

    def poll(self, timeout: float = 0.0) -> None:
        for msg in _kafka.consume_available(self._consumer, 500, timeout):
            err = msg.error()
            if err is not None:
                if _kafka.is_partition_eof(err):
                    self.caught_up = True
                else:
                    logger.warning("reading %s: %s", self._topic, err)
                continue
            seen = _kafka.append_time_ms(msg) or int(time.time() * 1000)
            try:
                self.view.apply(msg.key(), msg.value(), seen)
            except WireFormatError as exc:
                self.malformed += 1
                logger.warning("%s offset %d ignored: %s", self._topic, msg.offset(), exc)

    def wait_caught_up(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.caught_up and time.monotonic() < deadline:
            self.poll(0.2)
        return self.caught_up

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
