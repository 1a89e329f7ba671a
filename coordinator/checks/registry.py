"""Live producer instances, from ``<ns>_producers``.

Every coordinator reads the whole registry with ``assign`` (it is not one of the
group's partitions). An instance is live until ``liveness_s`` after the broker's
append time of its last heartbeat, on the brokers' clock (:mod:`coordinator.checks.broker_clock`:
the heartbeats read live are its samples); a tombstone means it left.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.checks.broker_clock import BrokerClock
from txbridge import kafka
from txbridge.errors import WireFormatError
from txbridge.kafka import Consumer
from txbridge.wire import ProducerInstance, can_answer, decode_producer

logger = logging.getLogger(__name__)


#: An instance that said its heartbeat interval and was not heard for this many intervals is
#: *silent*: most likely gone (a SIGKILL writes no tombstone), though still live until
#: ``liveness_s`` runs out.
SILENT_INTERVALS = 2.5
#: How long, after the registry was read to its end, checks wait for a heartbeat to set the
#: brokers' clock (producers beat every second by default).
CLOCK_WAIT_S = 3.0


@dataclass(frozen=True)
class Heartbeat:
    url: str
    seen_ms: int  # broker append time (when read, on the brokers' clock, if the topic keeps CreateTime)
    interval_ms: int = 0  # the interval the instance said it beats at (0: not said)
    decisive: bool = False  # its check function is decisive
    source: str | None = None  # the source of truth its check answers from (None: not said)


class RegistryView:
    """The registry's content: pure, fed with records."""

    def __init__(self, liveness_s: float) -> None:
        self.liveness_ms = int(liveness_s * 1000)
        self._instances: dict[tuple[str, str], Heartbeat] = {}
        #: The check source each instance said last, kept after it left: what its transactions need.
        self._sources: dict[tuple[str, str], str | None] = {}
        #: Instances with a decisive check that left with a tombstone since the caller took them.
        self.left: set[tuple[str, str]] = set()

    def apply(self, key: bytes | None, value: bytes | None, seen_ms: int) -> None:
        """One registry record. Raises WireFormatError for a value that is not a heartbeat."""
        if value is None:
            group, _, instance = (key or b"").decode("utf-8", "replace").partition("/")
            gone = self._instances.pop((group, instance), None)
            if gone is not None and gone.decisive:
                self.left.add((group, instance))
            return
        beat: ProducerInstance = decode_producer(value)
        current = self._instances.get((beat.group, beat.instance))
        if current is None or current.seen_ms <= seen_ms:
            self._instances[(beat.group, beat.instance)] = Heartbeat(
                beat.url, seen_ms, int(beat.interval_s * 1000), beat.decisive, beat.source
            )
            self._sources[(beat.group, beat.instance)] = beat.source

    def _silent(self, beat: Heartbeat, now_ms: int) -> bool:
        return beat.interval_ms > 0 and now_ms - beat.seen_ms > SILENT_INTERVALS * beat.interval_ms

    def targets(self, group: str, instance: str, source: str | None, now_ms: int) -> list[str]:
        """Check URLs to try about a transaction that ``instance`` wrote with check source
        ``source``: the writer first if live, then the group's other live instances that can
        answer for that source (:func:`txbridge.wire.can_answer`); silent instances (see
        :data:`SILENT_INTERVALS`) after all the others. Empty while none can answer: the
        transaction then waits for its writer (or one on its source of truth) to be live."""
        live = {
            inst: beat
            for (grp, inst), beat in self._instances.items()
            if grp == group
            and now_ms - beat.seen_ms <= self.liveness_ms
            and can_answer(writer=instance, tx_source=source, instance=inst, instance_source=beat.source)
        }
        order = sorted(live, key=lambda inst: (self._silent(live[inst], now_ms), inst != instance, inst))
        return [live[inst].url for inst in order]

    def instances_of(self, group: str, now_ms: int) -> tuple[tuple[str, str | None, str], ...]:
        """``(instance, check source, URL)`` of the group's live instances, silent ones last."""
        live = [
            (self._silent(beat, now_ms), inst, beat)
            for (grp, inst), beat in self._instances.items()
            if grp == group and now_ms - beat.seen_ms <= self.liveness_ms
        ]
        return tuple(
            (inst, beat.source, beat.url) for _silent, inst, beat in sorted(live, key=lambda x: x[:2])
        )

    def silent(self, now_ms: int) -> set[tuple[str, str]]:
        """Instances not heard for :data:`SILENT_INTERVALS` of their heartbeat interval."""
        return {key for key, beat in self._instances.items() if self._silent(beat, now_ms)}

    def decisive_elsewhere(self, group: str, instance: str, now_ms: int) -> bool:
        """Another instance of ``group`` is live, heard from lately, its check is decisive, and it
        can answer for ``instance``'s transactions (the check source ``instance`` said last)."""
        source = self._sources.get((group, instance))
        return any(
            grp == group
            and inst != instance
            and beat.decisive
            and can_answer(writer=instance, tx_source=source, instance=inst, instance_source=beat.source)
            and now_ms - beat.seen_ms <= self.liveness_ms
            and not self._silent(beat, now_ms)
            for (grp, inst), beat in self._instances.items()
        )

    def live(self, now_ms: int) -> set[tuple[str, str]]:
        """The (group, instance) pairs live at ``now_ms``."""
        return {key for key, beat in self._instances.items() if now_ms - beat.seen_ms <= self.liveness_ms}

    def beating(self) -> bool:
        """Any instance said it heartbeats at an interval (so a heartbeat is to come)."""
        return any(beat.interval_ms > 0 for beat in self._instances.values())

    def __len__(self) -> int:
        return len(self._instances)


class ProducerRegistry:
    """Reads ``<ns>_producers`` into a :class:`RegistryView`; call :meth:`poll` from the loop.

    Once read to its end, every heartbeat it reads was just appended: it gives ``clock`` a
    sample. It is :attr:`caught_up` once read to its end and the clock has a sample, or no
    instance says it heartbeats, or :data:`CLOCK_WAIT_S` after the end when no heartbeat came (no
    live producer, or a topic that keeps CreateTime): until then a check could be due early on
    the wall clock.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        liveness_s: float,
        extra: Mapping[str, Any] | None = None,
        *,
        clock: BrokerClock,
    ) -> None:
        self.view = RegistryView(liveness_s)
        self._clock = clock
        self.caught_up = False
        self._end_read_at: float | None = None  # monotonic time the registry was first read to its end
        self._bootstrap, self._topic, self._extra = bootstrap, topic, extra
        self._consumer: Consumer | None = None
        self.malformed = 0

    def start(self) -> None:
        # A throwaway group id: this consumer never commits, it re-reads the compacted topic.
        self._consumer = kafka.consumer(
            self._bootstrap,
            f"txbridge-registry-{uuid.uuid4().hex[:8]}",
            self._extra,
            enable_partition_eof=True,
        )
        self._consumer.assign([kafka.partition_at(self._topic, 0, kafka.FROM_START)])

    def poll(self, timeout: float = 0.0) -> None:
        for msg in kafka.consume_available(
            kafka.opened(self._consumer, "the registry's consumer"), 500, timeout
        ):
            err = msg.error()
            if err is not None:
                if kafka.is_partition_eof(err):
                    if self._end_read_at is None:
                        self._end_read_at = time.monotonic()
                else:
                    logger.warning("reading %s: %s", self._topic, err)
                continue
            appended = kafka.append_time_ms(msg)
            if self._end_read_at is not None and msg.value() is not None:
                self._clock.observe(appended)
            seen = appended or self._clock.now_ms()
            try:
                self.view.apply(msg.key(), msg.value(), seen)
            except WireFormatError as exc:
                self.malformed += 1
                logger.warning("%s offset %d ignored: %s", self._topic, msg.offset(), exc)
        if not self.caught_up and self._end_read_at is not None:
            self.caught_up = (
                self._clock.measured()
                or not self.view.beating()
                or time.monotonic() > self._end_read_at + CLOCK_WAIT_S
            )

    def wait_caught_up(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.caught_up and time.monotonic() < deadline:
            self.poll(0.2)
        return self.caught_up

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
