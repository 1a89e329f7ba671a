"""The local cluster's node processes: one node's launch, status, log and stop, and the wait
until starting nodes serve clients."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers.cluster_config import NodeSetup
from servers.cluster_layout import ClusterLayout, NodePorts
from servers.processes import await_exit, pid_alive, rss, spawn
from servers.startup import StartupWatch
from txbridge.errors import BrokerError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeStatus:
    """One node: whether its process lives, and where its client listener and log are."""

    node_id: int
    running: bool
    pid: int | None
    address: str
    log_file: Path
    rss_bytes: int | None = None


class ClusterNode:
    """One node's process: launched by this object, or found again through its pid file.

    Args:
        node_id: the node.
        layout: the cluster's files.
        setup: the nodes' Java command lines.
    """

    def __init__(self, node_id: int, layout: ClusterLayout, setup: NodeSetup) -> None:
        self.node_id = node_id
        self._layout = layout
        self._setup = setup
        self._process: subprocess.Popen[bytes] | None = None
        # Where the node's Kafka log stood when this object launched it: a failed start
        # shows that run's lines, not the previous run's.
        self._log_offset = 0

    @property
    def _pid_file(self) -> Path:
        return self._layout.node_dir(self.node_id) / "node.pid"

    def forget(self) -> None:
        """Remove the node's pid file."""
        self._pid_file.unlink(missing_ok=True)

    def running_pid(self) -> int | None:
        """The node's pid if it lives (and is that node, not a reused pid)."""
        import psutil

        try:
            pid = int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:
            server = str(self._layout.node_dir(self.node_id) / "server.properties")
            ours = server in psutil.Process(pid).cmdline()
        except psutil.Error:
            ours = False
        return pid if ours else None

    def status(self, ports: Mapping[int, NodePorts]) -> NodeStatus:
        """Whether the node runs, with its client address (when ``ports`` has it), pid, RSS and log."""
        pid = self.running_pid()
        address = f"{self._layout.host}:{ports[self.node_id].client}" if self.node_id in ports else ""
        memory = rss(pid) if pid is not None else None
        log = self._layout.log_file(self.node_id)
        return NodeStatus(self.node_id, pid is not None, pid, address, log, memory)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the node's stdout (JVM errors) and of its Kafka log.

        For a node this object launched, only the Kafka log lines of that run.
        """
        parts: list[str] = []
        stdout = self._layout.node_dir(self.node_id) / "logs" / "stdout.log"
        if stdout.is_file():
            parts.extend(stdout.read_text(errors="replace").splitlines()[-lines:])
        log = self._layout.log_file(self.node_id)
        if log.is_file():
            with log.open("rb") as f:
                f.seek(self._log_offset)
                parts.extend(f.read().decode(errors="replace").splitlines()[-lines:])
        return "\n".join(parts)

    def launch(self, classpath: str) -> None:
        """Start the node's JVM in a session of its own, and write its pid file."""
        folder = self._layout.node_dir(self.node_id)
        log = self._layout.log_file(self.node_id)
        self._log_offset = log.stat().st_size if log.is_file() else 0
        command = self._setup.java(
            self.node_id, classpath, "kafka.Kafka", str(folder / "server.properties"), server=True
        )
        self._process = spawn(command, folder / "logs" / "stdout.log", self._pid_file)

    def exited(self) -> int | None:
        """The exit code of the node if it died (-1 when another process launched it), else None."""
        if self._process is not None:
            return self._process.poll()
        return None if self.running_pid() is not None else -1

    def await_exit(self, pid: int, timeout: float) -> None:
        """Wait up to ``timeout`` for ``pid`` to exit, then SIGKILL it; forget the node's pid."""
        await_exit(pid, timeout, what=f"node {self.node_id}")
        if self._process is not None:
            self._process.wait(timeout=5)
            self._process = None
        self.forget()

    def kill(self) -> bool:
        """SIGKILL the node, as a crash would, and wait for it to exit. False if it was not running."""
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        self.await_exit(pid, 10.0)
        return True

    def terminate(self) -> int | None:
        """SIGTERM the node; its pid, or None if it was not running (then :meth:`await_exit`)."""
        pid = self.running_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        return pid


def wait_until_serving(
    nodes: Mapping[int, ClusterNode],
    starting: list[int],
    layout: ClusterLayout,
    client_config: Mapping[str, str],
    timeout: float,
) -> None:
    """Wait until every node is registered and unfenced, as an authenticated client sees it,
    and each of ``starting`` serves clients itself (:func:`_serving`).

    Raises:
        BrokerError: a starting node exited, or the starting nodes wrote nothing to their logs for
            ``timeout`` before they all served (the first missing node's log tail is in the message).
    """
    from txbridge import kafka
    from txbridge.kafka import KafkaException

    watch = StartupWatch(
        [layout.log_file(i) for i in starting], timeout, f"the local cluster's nodes {starting}"
    )
    # Quiet: refused connections and failed handshakes are expected while the nodes start.
    quiet = {**client_config, "log_level": 0}
    admin = kafka.admin(layout.bootstrap, quiet)
    ports = layout.ports()
    # One client per node, bootstrapped on that node alone: until the node answers, it is
    # the only broker the client knows, so an answer comes from that node.
    alone = {i: kafka.admin(f"{layout.host}:{ports[i].client}", quiet) for i in starting}
    serving: set[int] = set()
    while True:
        for node_id in starting:
            code = nodes[node_id].exited()
            if code is not None:
                nodes[node_id].forget()
                raise BrokerError(
                    f"node {node_id} of the local cluster exited with code {code} during start-up; "
                    f"log {layout.log_file(node_id)}:\n{nodes[node_id].log_tail()}"
                )
        try:
            brokers = set(admin.list_topics(timeout=2.0).brokers)
        except KafkaException:
            brokers = set()
        serving |= {i for i in set(starting) - serving if _serving(alone[i])}
        if brokers >= set(layout.node_ids) and serving >= set(starting):
            return
        if watch.hung():
            missing = sorted(set(layout.node_ids) - brokers) or sorted(set(starting) - serving)
            raise BrokerError(
                f"nodes {missing} of the local cluster did not join, and wrote nothing to their logs "
                f"for {timeout:.0f}s "
                f"(an authenticated client at {layout.bootstrap} sees nodes {sorted(brokers)}, "
                f"nodes {sorted(serving)} of {starting} serve clients); "
                f"log {layout.log_file(missing[0])}:\n{nodes[missing[0]].log_tail()}"
            )
        time.sleep(0.5)


def _serving(alone: Any) -> bool:
    """Whether the node a client was bootstrapped on alone has answered it.

    The others may list a restarted node long before it serves: one killed and started again
    within the controller's session timeout (9 s) never left their listing. A node serves
    requests only once it has caught up with the cluster's metadata, so an answer means that
    the cluster has seen it come back. Any answer counts, whoever sent it (the metadata's
    ``orig_broker_id`` is -1 for the bootstrap connection, or another node once the client
    has learnt them): the client learns of other nodes only from that node's first answer.
    """
    from txbridge.kafka import KafkaException

    try:
        alone.list_topics(timeout=1.0)
    except KafkaException:
        return False
    return True
