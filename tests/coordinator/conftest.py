"""Fixtures of the coordinator tests: a namespace per test, a wire-level producer, coordinators in threads."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig, Secrets
from coordinator.service import Coordinator
from coordinator.state.partition import PartitionState
from tests.coordinator.check_server import CheckServer
from tests.coordinator.wire_producer import WireProducer
from tests.kafka_helpers import eventually  # noqa: F401  (the coordinator tests import it from here)
from txbridge.wire import Topics

SECRET = "test-secret-1"  # noqa: S105 - a test-only HMAC secret
PARTITIONS = 3
#: The group protocol of the tests' coordinators (classic unless this names another).
GROUP_PROTOCOL_ENV = "TXBRIDGE_TEST_GROUP_PROTOCOL"


@dataclass
class RunningCoordinator:
    service: Coordinator
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    def stop(self, timeout: float = 60.0) -> None:
        self.service.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the coordinator did not stop"
        if self.errors:
            raise self.errors[0]


@dataclass
class Env:
    bootstrap: str
    namespace: str
    topics: Topics
    producer: WireProducer
    running: list[RunningCoordinator] = field(default_factory=list)

    def config(self, **overrides: Any) -> CoordinatorConfig:
        """The tests' settings with ``overrides``; ``group_id=None`` leaves the group to its
        default (the namespace's)."""
        values: dict[str, Any] = {
            "bootstrap": self.bootstrap,
            "namespace": self.namespace,
            "group_id": f"coord-{self.namespace}",
            "instance_id": f"c-{uuid.uuid4().hex[:6]}",
            "check_delay_s": 0.5,
            "check_backoff_s": 0.3,
            "check_backoff_max_s": 0.5,
            "max_checks": 3,
            "check_timeout_s": 2.0,
            "producer_liveness_s": 60.0,
            "log_interval_s": 5.0,
            "secrets": Secrets(default=SECRET),
            "check_invariants": True,  # the state's invariants asserted after every step
            # Every coordinator test can be run under either group protocol (docs/testing.md).
            "group_protocol": os.environ.get(GROUP_PROTOCOL_ENV, "classic"),
        }
        values.update(overrides)
        if values["group_id"] is None:
            del values["group_id"]
        return CoordinatorConfig(**values)

    def start(self, *, wait: bool = True, **overrides: Any) -> RunningCoordinator:
        service = Coordinator(self.config(**overrides))
        handle = RunningCoordinator(service, threading.Thread(target=lambda: None))

        def target() -> None:
            try:
                service.run()
            except BaseException as exc:  # kept for the test to inspect; stop() re-raises it
                handle.errors.append(exc)

        handle.thread = threading.Thread(target=target, name="coordinator", daemon=True)
        handle.thread.start()
        self.running.append(handle)
        if wait:
            assert service.running.wait(60), "the coordinator got no partitions within 60s"
        return handle


@pytest.fixture
def env(kafka_bootstrap: str, namespace_factory: Callable[..., str]) -> Iterator[Env]:
    namespace = namespace_factory(PARTITIONS, prefix="txbt")
    environment = Env(
        kafka_bootstrap, namespace, Topics(namespace), WireProducer(kafka_bootstrap, namespace, PARTITIONS)
    )
    yield environment
    for handle in environment.running:
        if handle.thread.is_alive():
            handle.stop()
    # A coordinator that died of a broken invariant fails the test even when the test did not
    # notice (other errors, such as being fenced, are some tests' point).
    broken = [exc for h in environment.running for exc in h.errors if isinstance(exc, AssertionError)]
    if broken:
        raise broken[0]


@pytest.fixture(autouse=True)
def _state_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every PartitionState in the coordinator tests asserts its invariants after every step."""
    monkeypatch.setattr(PartitionState, "debug", True)


@pytest.fixture
def check_server() -> Iterator[CheckServer]:
    server = CheckServer(SECRET.encode()).start()
    yield server
    server.stop()
