"""The ports the local servers are started on: free, and out of the way of outgoing connections.

CI's four-path demo once failed because RocketMQ's broker could not bind its HA port
(``listenPort + 1``): the port was free when picked, then an outgoing connection took it
as its local port during the seconds the JVMs took to start.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from servers import broker
from servers.broker import free_port, port_free, port_in_use
from servers.rocketmq import free_broker_port
from txbridge.errors import BrokerError

HOST = "127.0.0.1"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock


def _connected_from(port: int, listener: socket.socket) -> socket.socket:
    """A client connection whose local port is ``port`` (nothing listens there)."""
    client = socket.socket()
    client.bind((HOST, port))
    client.connect(listener.getsockname())
    return client


def _pick_until_none_left(neighbours: tuple[int, ...]) -> list[int]:
    """Call free_port until no port is left (each pick uses its ports up); 10 ports hold 3 triples."""
    picks: list[int] = []
    for _ in range(3):
        try:
            picks.append(free_port(neighbours=neighbours))
        except BrokerError:
            break
    with pytest.raises(BrokerError, match="found no free port"):
        free_port(neighbours=neighbours)
    return picks


def test_ports_come_from_outside_the_range_outgoing_connections_take_theirs_from() -> None:
    low, high = broker._ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert not [p for p in ports if low <= p <= high]
    assert len(set(ports)) == len(ports), "a port was handed out twice"
    assert all(port_free(HOST, p) for p in ports)


def test_a_port_an_outgoing_connection_holds_is_not_free(listener: socket.socket) -> None:
    port = free_port()
    with _connected_from(port, listener):
        assert not port_in_use(HOST, port), "nothing listens there: a connect test cannot see it"
        assert not port_free(HOST, port)


def test_free_port_skips_ports_held_by_connections_and_their_neighbours(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ten ports to choose from; a connection holds the local port 2 above the first.
    first = free_port(neighbours=tuple(range(1, 10)))
    monkeypatch.setattr(broker, "_listen_range", lambda: range(first, first + 10))
    monkeypatch.setattr(broker, "_handed_out", set())
    with _connected_from(first + 2, listener):
        picks = _pick_until_none_left(neighbours=(-2, 1))
    assert picks, "the range held free triples"
    used = [q for p in picks for q in (p - 2, p, p + 1)]
    assert set(used) <= set(range(first, first + 10)), "a triple left the range"
    assert first + 2 not in used, "a port the connection holds was handed out"
    assert len(set(used)) == len(used), "a port was handed out twice"


def test_the_rocketmq_broker_port_has_its_fast_and_ha_ports_free() -> None:
    low, high = broker._ephemeral_range()
    for _ in range(20):
        port = free_broker_port()
        for p in (port - 2, port, port + 1):
            assert not low <= p <= high
            assert port_free(HOST, p)
