"""Where the local cluster keeps its files under its home, and its ``cluster.json``.

The layout is drawn in :mod:`servers.cluster`. ``cluster.json`` holds what
must not change between starts: the cluster id, the host and every node's ports, picked
once on the first start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers.broker import _cluster_id, free_port
from txbridge.errors import BrokerError, ConfigurationError


@dataclass(frozen=True)
class NodePorts:
    """The three listener ports of one node."""

    client: int
    internal: int
    controller: int


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (passwords, private keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def java_properties(props: Mapping[str, str]) -> str:
    """``props`` in Java's Properties format."""
    # A newline inside a value (an inline PEM) is written as the escape \n.
    escaped = {k: v.replace("\n", "\\n") for k, v in props.items()}
    return "".join(f"{k}={v}\n" for k, v in escaped.items())


class ClusterLayout:
    """The paths of one cluster's home and the state in its ``cluster.json``.

    Args:
        home: the cluster's folder.
        node_ids: its nodes.
        host: the address every listener binds to (on a first start).
    """

    def __init__(self, home: Path, node_ids: list[int], host: str) -> None:
        self.home = home
        self.node_ids = node_ids
        self.host = host

    @property
    def state_file(self) -> Path:
        """``cluster.json``."""
        return self.home / "cluster.json"

    @property
    def tls_folder(self) -> Path:
        """The CA's and the nodes' certificates and keys."""
        return self.home / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) that clients trust."""
        return self.tls_folder / "ca.pem"

    def node_dir(self, node_id: int) -> Path:
        """Node ``node_id``'s folder: its config, data, logs and pid file."""
        return self.home / f"node-{node_id}"

    def log_file(self, node_id: int) -> Path:
        """Node ``node_id``'s Kafka log."""
        return self.node_dir(node_id) / "logs" / "server.log"

    def is_formatted(self, node_id: int) -> bool:
        """Whether node ``node_id``'s storage was formatted."""
        return (self.node_dir(node_id) / "data" / "meta.properties").is_file()

    def read_state(self) -> dict[str, Any] | None:
        """``cluster.json``, or None before the first start."""
        if not self.state_file.is_file():
            return None
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state

    def ports(self) -> dict[int, NodePorts]:
        """Every node's ports.

        Raises:
            BrokerError: no cluster was ever started in ``home``.
        """
        state = self.read_state()
        if state is None:
            raise BrokerError(
                f"no cluster was ever started in {self.home}: "
                "start it with 'txbridge kafka start --brokers 3 --secure'"
            )
        return {int(i): NodePorts(**p) for i, p in state["ports"].items()}

    def ensure_state(self) -> dict[str, Any]:
        """Read ``cluster.json``, or on a first start pick the cluster id and free ports.

        Raises:
            ConfigurationError: ``home`` holds a cluster of another size.
        """
        state = self.read_state()
        if state is not None:
            if len(state["ports"]) != len(self.node_ids):
                raise ConfigurationError(
                    f"{self.home} holds a {len(state['ports'])}-node cluster, not {len(self.node_ids)}: "
                    f"start it with {len(state['ports'])} nodes, or delete {self.home} to begin afresh"
                )
            return state

        state = {
            "cluster_id": _cluster_id(),
            "host": self.host,
            "ports": {
                str(i): {
                    "client": free_port(self.host),
                    "internal": free_port(self.host),
                    "controller": free_port(self.host),
                }
                for i in self.node_ids
            },
        }
        self.home.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        return state

    @property
    def bootstrap(self) -> str:
        """The client listeners of every node, comma-separated.

        Raises:
            BrokerError: no cluster was ever started in ``home``.
        """
        return ",".join(f"{self.host}:{p.client}" for p in self.ports().values())
