"""The producer registry: heartbeats of this instance's check URL to ``<ns>_producers``.

The first heartbeat is written and acknowledged in :meth:`Heartbeat.start`, so a
producer that cannot register fails at start-up; later ones are written every
``interval_s`` by a background thread (a failed one is logged and retried at the
next beat). :meth:`Heartbeat.stop` writes a tombstone: the instance left.
"""

from __future__ import annotations

import logging
import threading

from txbridge.delivery import DeliveryPump, wait_all
from txbridge.errors import KafkaOperationError
from txbridge.wire import ProducerInstance

logger = logging.getLogger(__name__)


class Heartbeat:
    """Heartbeats of one producer instance.

    Args:
        pump: the producer's shared delivery pump.
        topic: the registry topic (``Topics(ns).producers``).
        group: the producer group.
        instance: this instance's id.
        url: the check URL to advertise.
        interval_s: seconds between heartbeats (said in each, so a coordinator notices a stop).
        decisive: the instance's check function is decisive (said in each heartbeat).
        source: the source of truth its check answers from (:func:`txbridge.wire.can_answer`).
    """

    def __init__(
        self,
        pump: DeliveryPump,
        topic: str,
        *,
        group: str,
        instance: str,
        url: str,
        interval_s: float,
        decisive: bool = False,
        source: str | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("heartbeat interval must be positive")
        self._pump = pump
        self.topic = topic
        self.record = ProducerInstance(
            group=group, instance=instance, url=url, interval_s=interval_s, decisive=decisive, source=source
        )
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> list[BaseException]:
        future = self._pump.produce(
            self.topic, partition=0, key=self.record.key(), value=self.record.encode(), headers=()
        )
        return wait_all([future], self._pump.message_timeout_s + 5)

    def start(self) -> None:
        """Write the first heartbeat (acknowledged), then beat in the background.

        Raises:
            KafkaOperationError: the first heartbeat was not acknowledged.
        """
        failures = self._beat()
        if failures:
            raise KafkaOperationError(f"registering this producer on {self.topic} failed: {failures[0]}")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="txbridge-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            failures = self._beat()
            if failures:
                logger.warning(
                    "heartbeat to %s failed (next in %.1fs): %s", self.topic, self.interval_s, failures[0]
                )

    def stop(self) -> None:
        """Stop beating and write a tombstone (acknowledged; a failure is logged)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(self.interval_s + self._pump.message_timeout_s + 5)
        self._thread = None
        future = self._pump.produce(self.topic, partition=0, key=self.record.key(), value=None, headers=())
        failures = wait_all([future], self._pump.message_timeout_s + 5)
        if failures:
            logger.warning(
                "the registry tombstone of %s was not written: %s", self.record.instance, failures[0]
            )
