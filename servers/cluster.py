"""A local secured, replicated Apache Kafka: three KRaft nodes on 127.0.0.1.

It is the Kafka txbridge's users run, in miniature: every node is broker and
controller at once, topics are replicated three times with ``min.insync.replicas``
2 (the offsets topic and the transaction state log too), clients authenticate with
SCRAM-SHA-512 over TLS, and ``StandardAuthorizer`` allows nothing without an ACL.
It runs from the same Maven Central jars as the single-node broker
(:mod:`servers.broker`).

Listeners of each node, all on 127.0.0.1::

    CLIENT      SASL_SSL, SCRAM-SHA-512      the clients' listener (advertised)
    INTERNAL    SSL, client certificate      broker to broker (advertised)
    CONTROLLER  SSL, client certificate      KRaft; Kafka has no SCRAM for controllers

The nodes talk to each other with mutual TLS: each node's certificate is its
identity (``User:CN=txbridge-kafka-node-<id>``, a super user), so no node password
exists. PLAINTEXT for the controllers would make every local process that reaches
the port the ``ANONYMOUS`` principal, which would then have to be a super user.

SCRAM users (``admin``, a super user, and ``producer``, ``coordinator``,
``consumer`` for least-privilege ACLs) are created when the storage is formatted;
their passwords are generated then and kept in 0600 files.

Layout of ``home`` (``.cache/kafka-cluster`` by default)::

    cluster.json                  cluster id, host and every node's ports
    tls/                          ca.pem, node-<id>.pem, node-<id>.key  (servers.certs)
    users/<user>.password         0600
    clients/<user>.properties     Java client settings (--command-config), 0600
    node-<id>/server.properties   0600: it holds the node's private key
    node-<id>/log4j2.properties  node-<id>/data/  node-<id>/logs/server.log  node-<id>/node.pid
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from servers import jars
from servers.broker import port_in_use
from servers.cluster_config import NodeSetup
from servers.cluster_layout import ClusterLayout
from servers.cluster_nodes import ClusterNode, NodeStatus, wait_until_serving
from servers.cluster_users import ADMIN_USER, ClusterUsers
from txbridge.errors import BrokerError, ConfigurationError

logger = logging.getLogger(__name__)

DEFAULT_NODES = 3
# Three of these, the test suite and a Spark session fit on 2 cores and 24 GiB.
DEFAULT_HEAP = "384m"


@dataclass(frozen=True)
class ClusterStatus:
    """Every node's status, the bootstrap list and the admin's client properties file."""

    nodes: tuple[NodeStatus, ...]
    bootstrap: str
    properties_file: Path

    @property
    def running(self) -> bool:
        """True when every node's process lives."""
        return bool(self.nodes) and all(n.running for n in self.nodes)

    @property
    def up(self) -> list[int]:
        """The ids of the nodes whose process lives."""
        return [n.node_id for n in self.nodes if n.running]


class LocalCluster:
    """Start, stop and inspect the local secured, replicated cluster.

    No I/O happens in the constructor. ``start()`` fetches the jars (once), picks
    free ports and issues certificates and passwords (first start), formats each
    node's storage with the SCRAM users (once) and waits until every node serves
    authenticated clients.

    The parts, each with the state it owns: the home's files and ``cluster.json``
    (:class:`~servers.cluster_layout.ClusterLayout`), the SCRAM users
    (:class:`~servers.cluster_users.ClusterUsers`), the nodes' config and
    storage (:class:`~servers.cluster_config.NodeSetup`) and each node's
    process (:class:`~servers.cluster_nodes.ClusterNode`).

    Args:
        home: folder for config, TLS files, passwords, data and logs.
        nodes: how many combined broker+controller nodes (at least 3).
        host: the address every listener binds to.
        heap: each node's JVM heap (fixed: ``-Xms`` = ``-Xmx``).

    Raises:
        ConfigurationError: fewer than 3 nodes.
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        nodes: int = DEFAULT_NODES,
        host: str = "127.0.0.1",
        heap: str = DEFAULT_HEAP,
    ) -> None:
        if nodes < 3:
            raise ConfigurationError(
                f"a replicated cluster needs at least 3 nodes (replication factor 3, min ISR 2), got {nodes}"
            )
        self.home = Path(home) if home else jars.cache_root() / "kafka-cluster"
        self.node_ids = list(range(1, nodes + 1))
        self.host = host
        self.heap = heap
        self._layout = ClusterLayout(self.home, self.node_ids, host)
        self._users = ClusterUsers(self._layout)
        self._setup = NodeSetup(self._layout, self._users, heap)
        self._nodes = {i: ClusterNode(i, self._layout, self._setup) for i in self.node_ids}

    def __repr__(self) -> str:
        return f"LocalCluster(home={str(self.home)!r}, nodes={len(self.node_ids)})"

    @classmethod
    def from_home(cls, home: Path | None = None) -> LocalCluster:
        """The cluster last started in ``home``, with its node count and host."""
        cluster = cls(home)
        state = cluster._layout.read_state()
        if state:
            cluster = cls(home, nodes=len(state["ports"]), host=state["host"])
        return cluster

    # ------------------------------------------------------------------ files and client settings

    def log_file(self, node_id: int) -> Path:
        """Node ``node_id``'s Kafka log."""
        return self._layout.log_file(node_id)

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) that clients trust."""
        return self._layout.ca_file

    @property
    def properties_file(self) -> Path:
        """The admin's Java client properties (``--command-config`` of the Kafka CLIs)."""
        return self.client_properties_file(ADMIN_USER)

    def client_properties_file(self, user: str) -> Path:
        """``user``'s Java client properties file."""
        return self._users.properties_file(user)

    @property
    def bootstrap(self) -> str:
        """The client listeners of every node, comma-separated.

        Raises:
            BrokerError: no cluster was ever started in ``home``.
        """
        return self._layout.bootstrap

    def password(self, user: str = ADMIN_USER) -> str:
        """``user``'s SCRAM password, read from its 0600 file.

        Raises:
            BrokerError: the cluster was never formatted in ``home``.
        """
        return self._users.password(user)

    def client_config(self, user: str = ADMIN_USER) -> dict[str, str]:
        """librdkafka security settings for ``user``: pass them as ``extra_config``.

        ``bootstrap.servers`` is not included: use :attr:`bootstrap`.
        """
        return self._users.client_config(user)

    def java_client_properties(self, user: str = ADMIN_USER) -> dict[str, str]:
        """The same settings with the Java client's names, as written to the properties file."""
        return self._users.java_client_properties(user)

    # ------------------------------------------------------------------ processes

    def status(self) -> ClusterStatus:
        """Which nodes run, with their client address, pid, RSS and log."""
        ports = self._layout.ports() if self._layout.read_state() else {}
        nodes = tuple(self._nodes[i].status(ports) for i in self.node_ids)
        bootstrap = ",".join(n.address for n in nodes if n.address)
        return ClusterStatus(nodes, bootstrap, self.properties_file)

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        """The last lines of node ``node_id``'s stdout (JVM errors) and of its Kafka log.

        For a node this object launched, only the Kafka log lines of that run.
        """
        return self._nodes[node_id].log_tail(lines)

    def start(self, *, timeout: float = 180.0) -> ClusterStatus:
        """Start every node that is not running and wait until all serve clients.

        Raises:
            BrokerError: every node already runs, a port is taken, or a node died or
                did not answer within ``timeout`` (its log's tail is in the message);
                the nodes this call started are stopped again.
            SetupError: Java or Maven missing, or the jars could not be fetched.
        """
        down = [i for i in self.node_ids if self._nodes[i].running_pid() is None]
        if not down:
            raise BrokerError(
                f"the local cluster already runs from {self.home} ({self.bootstrap}); "
                "stop it with 'txbridge kafka stop'"
            )
        return self._start(down, timeout)

    def start_node(self, node_id: int, *, timeout: float = 120.0) -> ClusterStatus:
        """Start one stopped node (after :meth:`kill_node`) and wait until it is back in the cluster.

        Raises:
            BrokerError: the node already runs, or did not come back (its log's tail is in the message).
        """
        if self._node(node_id).running_pid() is not None:
            raise BrokerError(f"node {node_id} already runs")
        return self._start([node_id], timeout)

    def _node(self, node_id: int) -> ClusterNode:
        if node_id not in self._nodes:
            raise ConfigurationError(f"no node {node_id}: the nodes are {self.node_ids}")
        return self._nodes[node_id]

    def _start(self, node_ids: list[int], timeout: float) -> ClusterStatus:
        started_at = time.monotonic()
        classpath = self._prepare(node_ids)
        for node_id in node_ids:
            self._nodes[node_id].launch(classpath)
        logger.info(
            "starting nodes %s of the secured Kafka %s at %s (logs under %s)",
            node_ids,
            jars.kafka_version(),
            self.bootstrap,
            self.home,
        )
        try:
            wait_until_serving(self._nodes, node_ids, self._layout, self.client_config(), timeout)
        except BrokerError:
            for node_id in node_ids:
                self._nodes[node_id].kill()
            raise
        logger.info("nodes %s are up in %.1fs", node_ids, time.monotonic() - started_at)
        return self.status()

    def _prepare(self, node_ids: list[int]) -> str:
        """Everything ``node_ids`` need before they launch; the Kafka classpath."""
        # Imported here: status and stop work without the cryptography package.
        from servers import certs

        state = self._layout.ensure_state()
        ports = self._layout.ports()
        for node_id in node_ids:
            for name, port in vars(ports[node_id]).items():
                if port_in_use(self.host, port):
                    raise BrokerError(
                        f"node {node_id}'s {name} port {port} on {self.host} is taken by another process: "
                        f"stop what listens there, or delete {self.home} to pick new ports"
                    )
        classpath = jars.kafka_classpath()
        # Re-issue certificates only when no node runs: a running node trusts the old CA.
        if len(node_ids) == len(self.node_ids):
            tls = certs.ensure_cluster_tls(self._layout.tls_folder, self.node_ids)
        else:
            tls = certs.cluster_tls_paths(self._layout.tls_folder, self.node_ids)
        self._users.ensure_passwords(any(self._layout.is_formatted(i) for i in self.node_ids))
        self._users.write_client_files()
        for node_id in node_ids:
            self._setup.write_files(node_id, self._setup.node_config(node_id, ports, tls))
        unformatted = [i for i in node_ids if not self._layout.is_formatted(i)]
        if unformatted:
            self._setup.format_storage(classpath, state["cluster_id"], unformatted)
        return classpath

    def kill_node(self, node_id: int) -> bool:
        """SIGKILL one node, as a crash would. False if it was not running."""
        return self._node(node_id).kill()

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop every node: SIGTERM to all at once, SIGKILL to any still alive after ``timeout``.

        Returns:
            False when no node was running.
        """
        pids = {i: pid for i in self.node_ids if (pid := self._nodes[i].terminate()) is not None}
        deadline = time.monotonic() + timeout
        for node_id, pid in pids.items():
            self._nodes[node_id].await_exit(pid, max(0.0, deadline - time.monotonic()))
        for node in self._nodes.values():
            node.forget()
        return bool(pids)
