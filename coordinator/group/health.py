"""What an orchestrator's probes ask: is the coordinator alive, is it ready, is any partition unserved.

``/healthz`` (liveness) answers 200 while the loop turns, or while an assignment is under
way (claiming and restoring may wait out a foreign transaction: a restart would only wait
again). ``/readyz`` (readiness) answers 200 once the coordinator serves its assignment (not
while an assignment it was given waits for the loop to take it over), unless it owns nothing
while partitions of its namespace are served by no member of its group: that is a
misconfiguration (two namespaces' coordinators sharing a group and an instance id, say), and
the coordinator says so in a WARNING that names what to set.
``/metrics`` serves the Prometheus counters and gauges beside them; :class:`StableOffsets`
adds how far each ``<ns>_state`` partition's last stable offset is behind, and for how long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group import membership
from coordinator.monitoring.metrics import Gauge
from txbridge import kafka

logger = logging.getLogger(__name__)

#: The loop turns at least every 0.1 s; this much silence outside an assignment means it is stuck.
LIVENESS_S = 60.0
#: How often a coordinator that owns nothing asks whether every partition is served.
LOOK_INTERVAL_S = 10.0
#: How often a scrape looks up the last stable offsets of ``<ns>_state`` (two ListOffsets
#: requests per partition leader); scrapes in between serve the last look.
STATE_LOOK_INTERVAL_S = 10.0


class Health:
    """The coordinator's liveness, readiness and unserved partitions (thread-safe reads)."""

    def __init__(self, config: CoordinatorConfig, half_topic: str) -> None:
        self.config = config
        self.half_topic = half_topic
        self.unserved: list[int] = []
        self._beat = time.monotonic()
        self._assigning = False
        self._serving = False
        self._owned = 0
        self._next_look = 0.0

    def beat(self) -> None:
        self._beat = time.monotonic()

    def assigning(self, under_way: bool) -> None:
        self._assigning = under_way
        self.beat()

    def serving(self, owned: int) -> None:
        """The assignment is restored: ``owned`` partitions are served."""
        self._serving, self._owned = True, owned
        if owned:
            self.unserved = []

    def stopped(self) -> None:
        self._serving = False

    def live(self) -> bool:
        return self._assigning or time.monotonic() - self._beat < LIVENESS_S

    def ready(self) -> bool:
        return self._serving and not self._assigning and not (self._owned == 0 and self.unserved)

    def look(self) -> None:
        """While this coordinator owns nothing, find the half partitions no member of its group owns."""
        if not self._serving or self._owned or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + LOOK_INTERVAL_S
        try:
            unserved = self._unserved()
        except Exception as exc:  # unknown for now: asked again at the next look
            logger.debug("looking for unserved partitions of %s: %s", self.half_topic, exc)
            return
        if unserved and unserved != self.unserved:
            logger.warning(
                "coordinator %s owns no partitions while partitions %s of %s are served by no member of "
                "group %s. Each namespace's coordinators need a group of their own (--group-id; by default "
                "it is derived from the namespace) and each running coordinator its own --instance-id.",
                self.config.instance_id,
                unserved,
                self.half_topic,
                self.config.group_id,
            )
        self.unserved = unserved

    def _unserved(self) -> list[int]:
        admin = kafka.admin(self.config.bootstrap, self.config.extra_config)
        topic = admin.list_topics(self.half_topic, timeout=10).topics.get(self.half_topic)
        if topic is None or topic.error is not None:
            return []
        served = {
            tp.partition
            for _instance, held in membership.assignments(self.config)
            for tp in held
            if tp.topic == self.half_topic
        }
        return sorted(set(topic.partitions) - served)


class StableOffsets:
    """How far each ``<ns>_state`` partition's last stable offset (LSO) is behind its high
    watermark, and for how long it has not moved while behind.

    A transaction left open on a ``<ns>_state`` partition (a hanging transaction the broker
    does not abort) holds its LSO: every read_committed reader of the partition, the next
    owner's restore among them, waits behind it. A scrape serves the last look and, at most
    every :data:`STATE_LOOK_INTERVAL_S`, starts the next on a thread of its own: never in the
    loop, and a slow or unreachable cluster never holds up the scrape. A failed look serves
    nothing (the series go stale rather than show old figures).
    """

    def __init__(
        self, config: CoordinatorConfig, topic: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config, self.topic = config, topic
        self._clock = clock
        self._admin: kafka.AdminClient | None = None
        self._lock = threading.Lock()
        self._since: dict[int, tuple[int, float]] = {}  # partition -> (its LSO, when first seen there)
        self._last: list[Gauge] = []
        self._next = 0.0
        self._looking = False

    def gauges(self) -> list[Gauge]:
        """The last look's gauges; starts the next look when one is due."""
        with self._lock:
            if not self._looking and self._clock() >= self._next:
                self._looking = True
                threading.Thread(target=self._refresh, name="txbridge-state-offsets", daemon=True).start()
            return self._last

    def _refresh(self) -> None:
        gauges: list[Gauge] = []
        try:
            gauges = self._look(self._clock())
        finally:  # _look catches what Kafka raises: this only keeps a bug from stopping the looks
            with self._lock:
                self._last = gauges
                self._next = self._clock() + STATE_LOOK_INTERVAL_S
                self._looking = False

    def _look(self, now: float) -> list[Gauge]:
        try:
            if self._admin is None:
                self._admin = kafka.admin(self.config.bootstrap, self.config.extra_config)
            offsets = kafka.stable_offsets(self._admin, self.topic, timeout=5.0)
        except Exception as exc:  # unknown for now: looked up again at a later scrape
            logger.debug("the last stable offsets of %s: %s", self.topic, exc)
            return []
        lag, stuck = {}, {}
        for partition, (stable, high) in sorted(offsets.items()):
            seen = self._since.get(partition)
            if seen is None or seen[0] != stable or stable >= high:
                self._since[partition] = seen = (stable, now)
            lag[str(partition)] = float(max(high - stable, 0))
            stuck[str(partition)] = 0.0 if stable >= high else now - seen[1]
        return [
            Gauge(
                "state_lso_lag",
                f"offsets between the last stable offset and the high watermark of {self.topic}",
                lag,
                "partition",
            ),
            Gauge(
                "state_lso_stuck_seconds",
                f"seconds the last stable offset of {self.topic} has stayed behind, unmoved",
                stuck,
                "partition",
            ),
        ]


def serve(port: int, health: Health, metrics: Callable[[], bytes]) -> ThreadingHTTPServer:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` on ``port``; ``shutdown()`` the result on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/healthz":
                live = health.live()
                self._answer(200 if live else 503, b"live\n" if live else b"stuck\n")
            elif self.path == "/readyz":
                ready = health.ready()
                why = b"ready\n" if ready else _not_ready(health)
                self._answer(200 if ready else 503, why)
            else:
                self._answer(404, b"not found\n")

        def _answer(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:  # probes every few seconds: not worth a line each
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104 - probes come from outside
    threading.Thread(target=server.serve_forever, name="txbridge-http", daemon=True).start()
    logger.info("metrics and probes on http://0.0.0.0:%d/ (metrics, healthz, readyz)", port)
    return server


def _not_ready(health: Health) -> bytes:
    if health.unserved:
        return f"not ready: owns nothing while partitions {health.unserved} are unserved\n".encode()
    return b"not ready: the assignment is not served yet\n"
