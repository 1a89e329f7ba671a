"""Whose CPU the bench meters as the broker's: a broker on this machine, whoever started it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from bench.kafka_native import broker_pid


@pytest.fixture
def listening() -> Iterator[int]:
    """A port this process listens on, as a broker started by another checkout would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_a_broker_this_checkout_did_not_start_is_found_by_its_port(listening: int) -> None:
    assert broker_pid(f"127.0.0.1:{listening}") == os.getpid()
    assert broker_pid(f"localhost:{listening}") == os.getpid()


def test_nobody_listening_a_remote_host_or_a_list_of_brokers_is_not_measured(listening: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # bound, never listening
        assert broker_pid(f"127.0.0.1:{closed}") is None
    assert broker_pid(f"kafka.example.com:{listening}") is None
    assert broker_pid(f"127.0.0.1:{listening},127.0.0.1:{closed}") is None
