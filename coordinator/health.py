"""What an orchestrator's probes ask: is the coordinator alive, is it ready, is any partition unserved.

``/healthz`` (liveness) answers 200 while the loop turns, or while an assignment is under
way (claiming and restoring may wait out a foreign transaction: a restart would only wait
again). ``/readyz`` (readiness) answers 200 once the coordinator serves its assignment,
unless it owns nothing while partitions of its namespace are served by no member of its
group: that is a misconfiguration (two namespaces' coordinators sharing a group and an
instance id, say), and the coordinator says so in a WARNING that names what to set.
``/metrics`` serves the Prometheus counters and gauges beside them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from coordinator import membership
from coordinator.config import CoordinatorConfig
from txbridge import kafka

logger = logging.getLogger(__name__)

#: The loop turns at least every 0.1 s; this much silence outside an assignment means it is stuck.
LIVENESS_S = 60.0
#: How often a coordinator that owns nothing asks whether every partition is served.
LOOK_INTERVAL_S = 10.0


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
        return self._serving and not (self._owned == 0 and self.unserved)

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
