"""A local secured, replicated Apache Kafka: three KRaft nodes on 127.0.0.1.

It is the Kafka txbridge's users run, in miniature: every node is broker and
controller at once, topics are replicated three times with ``min.insync.replicas``
2 (the offsets topic and the transaction state log too), clients authenticate with
SCRAM-SHA-512 over TLS, and ``StandardAuthorizer`` allows nothing without an ACL.
It runs from the same Maven Central jars as the single-node broker
(:mod:`txbridge.tools.local.broker`).

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
    tls/                          ca.pem, node-<id>.pem, node-<id>.key  (txbridge.tools.local.certs)
    users/<user>.password         0600
    clients/<user>.properties     Java client settings (--command-config), 0600
    node-<id>/server.properties   0600: it holds the node's private key
    node-<id>/log4j2.properties  node-<id>/data/  node-<id>/logs/server.log  node-<id>/node.pid
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txbridge.errors import BrokerError, ConfigurationError
from txbridge.tools.local import jars
from txbridge.tools.local.broker import _cluster_id, _pid_alive, free_port, java_command, port_in_use
from txbridge.tools.local.startup import StartupWatch

if TYPE_CHECKING:
    from txbridge.tools.local import certs

logger = logging.getLogger(__name__)

DEFAULT_NODES = 3
# Three of these, the test suite and a Spark session fit on 2 cores and 24 GiB.
DEFAULT_HEAP = "384m"
SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
#: SCRAM users created at format time: the admin (a super user) and one per role of txbridge.
USERS = (ADMIN_USER, "producer", "coordinator", "consumer")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True)
class NodePorts:
    """The three listener ports of one node."""

    client: int
    internal: int
    controller: int


@dataclass(frozen=True)
class NodeStatus:
    """One node: whether its process lives, and where its client listener and log are."""

    node_id: int
    running: bool
    pid: int | None
    address: str
    log_file: Path
    rss_bytes: int | None = None


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


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (passwords, private keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _properties(props: Mapping[str, str]) -> str:
    # Java's Properties format: a newline inside a value (an inline PEM) is written as the escape \n.
    escaped = {k: v.replace("\n", "\\n") for k, v in props.items()}
    return "".join(f"{k}={v}\n" for k, v in escaped.items())


def _rss(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


class LocalCluster:
    """Start, stop and inspect the local secured, replicated cluster.

    No I/O happens in the constructor. ``start()`` fetches the jars (once), picks
    free ports and issues certificates and passwords (first start), formats each
    node's storage with the SCRAM users (once) and waits until every node serves
    authenticated clients.

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
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        # Where each node's Kafka log stood when this object launched it: a failed start
        # shows that run's lines, not the previous run's.
        self._log_offsets: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"LocalCluster(home={str(self.home)!r}, nodes={len(self.node_ids)})"

    @classmethod
    def from_home(cls, home: Path | None = None) -> LocalCluster:
        """The cluster last started in ``home``, with its node count and host."""
        cluster = cls(home)
        state = cluster._read_state()
        if state:
            cluster = cls(home, nodes=len(state["ports"]), host=state["host"])
        return cluster

    # ------------------------------------------------------------------ paths and state

    @property
    def _state_file(self) -> Path:
        return self.home / "cluster.json"

    def _node_dir(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}"

    def log_file(self, node_id: int) -> Path:
        """Node ``node_id``'s Kafka log."""
        return self._node_dir(node_id) / "logs" / "server.log"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) that clients trust."""
        return self.home / "tls" / "ca.pem"

    @property
    def properties_file(self) -> Path:
        """The admin's Java client properties (``--command-config`` of the Kafka CLIs)."""
        return self.client_properties_file(ADMIN_USER)

    def client_properties_file(self, user: str) -> Path:
        """``user``'s Java client properties file."""
        return self.home / "clients" / f"{self._known(user)}.properties"

    def _password_file(self, user: str) -> Path:
        return self.home / "users" / f"{self._known(user)}.password"

    def _read_state(self) -> dict[str, Any] | None:
        if not self._state_file.is_file():
            return None
        state: dict[str, Any] = json.loads(self._state_file.read_text())
        return state

    def _ports(self) -> dict[int, NodePorts]:
        state = self._read_state()
        if state is None:
            raise BrokerError(
                f"no cluster was ever started in {self.home}: "
                "start it with 'txbridge kafka start --brokers 3 --secure'"
            )
        return {int(i): NodePorts(**p) for i, p in state["ports"].items()}

    def _ensure_state(self) -> dict[str, Any]:
        """Read ``cluster.json``, or on a first start pick the cluster id and free ports."""
        state = self._read_state()
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
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")
        return state

    @property
    def bootstrap(self) -> str:
        """The client listeners of every node, comma-separated.

        Raises:
            BrokerError: no cluster was ever started in ``home``.
        """
        return ",".join(f"{self.host}:{p.client}" for p in self._ports().values())

    # ------------------------------------------------------------------ client settings

    def _known(self, user: str) -> str:
        if user not in USERS:
            raise ConfigurationError(f"unknown SCRAM user {user!r}: the local cluster has {', '.join(USERS)}")
        return user

    def password(self, user: str = ADMIN_USER) -> str:
        """``user``'s SCRAM password, read from its 0600 file.

        Raises:
            BrokerError: the cluster was never formatted in ``home``.
        """
        path = self._password_file(user)
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise BrokerError(
                f"no password for {user!r} in {path.parent}: "
                "start the cluster with 'txbridge kafka start --brokers 3 --secure'"
            ) from None

    def client_config(self, user: str = ADMIN_USER) -> dict[str, str]:
        """librdkafka security settings for ``user``: pass them as ``extra_config``.

        ``bootstrap.servers`` is not included: use :attr:`bootstrap`.
        """
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.password(user),
            "ssl.ca.location": str(self.ca_file),
        }

    def java_client_properties(self, user: str = ADMIN_USER) -> dict[str, str]:
        """The same settings with the Java client's names, as written to the properties file."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.jaas.config": (
                f'{_SCRAM_LOGIN} required username="{user}" password="{self.password(user)}";'
            ),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
        }

    def _ensure_passwords(self, any_formatted: bool) -> None:
        """Generate each user's password once, before the storage that records it is formatted."""
        for user in USERS:
            path = self._password_file(user)
            if path.is_file():
                continue
            if any_formatted:
                raise BrokerError(
                    f"{path} is missing but the cluster's storage is formatted with its SCRAM "
                    f"credential: delete {self.home} to begin afresh"
                )
            # URL-safe characters: no quoting needed in JAAS, properties or --add-scram.
            _write_private(path, secrets.token_urlsafe(24) + "\n")

    def _write_client_files(self) -> None:
        for user in USERS:
            _write_private(self.client_properties_file(user), _properties(self.java_client_properties(user)))

    # ------------------------------------------------------------------ node configuration

    def _node_config(
        self, node_id: int, ports: dict[int, NodePorts], tls: certs.ClusterTls
    ) -> dict[str, str]:
        from txbridge.tools.local import certs

        own = ports[node_id]
        rf, min_isr = "3", "2"
        super_users = [f"User:CN={certs.node_common_name(i)}" for i in self.node_ids] + [f"User:{ADMIN_USER}"]
        return {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": ",".join(f"{i}@{self.host}:{p.controller}" for i, p in ports.items()),
            "listeners": (
                f"CLIENT://{self.host}:{own.client},INTERNAL://{self.host}:{own.internal},"
                f"CONTROLLER://{self.host}:{own.controller}"
            ),
            "advertised.listeners": f"CLIENT://{self.host}:{own.client},INTERNAL://{self.host}:{own.internal}",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": f"{_SCRAM_LOGIN} required;",
            # Nodes prove who they are with their certificate; clients with SCRAM.
            "ssl.client.auth": "required",
            "listener.name.client.ssl.client.auth": "none",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": tls.nodes[node_id].chain.read_text(),
            "ssl.keystore.key": tls.nodes[node_id].key.read_text(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca),
            "authorizer.class.name": AUTHORIZER,
            "super.users": ";".join(super_users),
            "allow.everyone.if.no.acl.found": "false",
            "log.dirs": str(self._node_dir(node_id) / "data"),
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": "0",
            # Fewer threads than the defaults (3 network, 8 I/O): three nodes share 2 cores.
            "num.network.threads": "2",
            "num.io.threads": "4",
        }

    def _write_node_files(self, node_id: int, config: Mapping[str, str]) -> Path:
        folder = self._node_dir(node_id)
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        server = folder / "server.properties"
        _write_private(server, _properties(config))
        (folder / "log4j2.properties").write_text(
            "rootLogger.level=INFO\n"
            "rootLogger.appenderRef.file.ref=FILE\n"
            "appender.file.type=File\n"
            "appender.file.name=FILE\n"
            f"appender.file.fileName={self.log_file(node_id)}\n"
            "appender.file.layout.type=PatternLayout\n"
            "appender.file.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=INFO\n"
            "logger.state.name=state.change.logger\nlogger.state.level=WARN\n"
        )
        return server

    def _java(self, node_id: int, classpath: str, *args: str, server: bool = False) -> list[str]:
        log4j = self._node_dir(node_id) / "log4j2.properties"
        return java_command(self.heap, log4j, classpath, *args, server=server, tool_heap="32m")

    def _is_formatted(self, node_id: int) -> bool:
        return (self._node_dir(node_id) / "data" / "meta.properties").is_file()

    def _format(self, classpath: str, cluster_id: str, node_ids: list[int]) -> None:
        """Format the nodes' storage in parallel, recording every SCRAM user's credential."""
        # The passwords go through a 0600 argument file (java @file), never the command line
        # that every local process can read in /proc.
        scram = [f"--add-scram {SCRAM_MECHANISM}=[name={u},password={self.password(u)}]" for u in USERS]
        running: dict[int, subprocess.Popen[str]] = {}
        try:
            for node_id in node_ids:
                node_args = self._node_dir(node_id) / "format.args"
                server = self._node_dir(node_id) / "server.properties"
                _write_private(
                    node_args,
                    f"kafka.tools.StorageTool format -t {cluster_id} -c {server}\n" + "\n".join(scram) + "\n",
                )
                running[node_id] = subprocess.Popen(
                    self._java(node_id, classpath, f"@{node_args}"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            for node_id, process in running.items():
                try:
                    out, _ = process.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    raise BrokerError(f"formatting node {node_id}'s storage did not finish in 120s") from None
                if process.returncode != 0:
                    for user in USERS:  # in case the tool echoes an argument
                        out = out.replace(self.password(user), "***")
                    raise BrokerError(
                        f"formatting node {node_id}'s storage failed (exit {process.returncode}): "
                        f"{out.strip()[-2000:]}"
                    )
        finally:
            for process in running.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for node_id in node_ids:
                (self._node_dir(node_id) / "format.args").unlink(missing_ok=True)

    # ------------------------------------------------------------------ processes

    def _pid_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "node.pid"

    def _running_pid(self, node_id: int) -> int | None:
        """The pid of node ``node_id`` if it lives (and is that node, not a reused pid)."""
        import psutil

        try:
            pid = int(self._pid_file(node_id).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not _pid_alive(pid):
            return None
        try:
            ours = str(self._node_dir(node_id) / "server.properties") in psutil.Process(pid).cmdline()
        except psutil.Error:
            ours = False
        return pid if ours else None

    def status(self) -> ClusterStatus:
        """Which nodes run, with their client address, pid, RSS and log."""
        state = self._read_state()
        ports = {int(i): NodePorts(**p) for i, p in state["ports"].items()} if state else {}
        nodes = []
        for node_id in self.node_ids:
            pid = self._running_pid(node_id)
            address = f"{self.host}:{ports[node_id].client}" if node_id in ports else ""
            rss = _rss(pid) if pid is not None else None
            nodes.append(NodeStatus(node_id, pid is not None, pid, address, self.log_file(node_id), rss))
        bootstrap = ",".join(n.address for n in nodes if n.address)
        return ClusterStatus(tuple(nodes), bootstrap, self.properties_file)

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        """The last lines of node ``node_id``'s stdout (JVM errors) and of its Kafka log.

        For a node this object launched, only the Kafka log lines of that run.
        """
        parts: list[str] = []
        stdout = self._node_dir(node_id) / "logs" / "stdout.log"
        if stdout.is_file():
            parts.extend(stdout.read_text(errors="replace").splitlines()[-lines:])
        log = self.log_file(node_id)
        if log.is_file():
            with log.open("rb") as f:
                f.seek(self._log_offsets.get(node_id, 0))
                parts.extend(f.read().decode(errors="replace").splitlines()[-lines:])
        return "\n".join(parts)

    def start(self, *, timeout: float = 180.0) -> ClusterStatus:
        """Start every node that is not running and wait until all serve clients.

        Raises:
            BrokerError: every node already runs, a port is taken, or a node died or
                did not answer within ``timeout`` (its log's tail is in the message);
                the nodes this call started are stopped again.
            SetupError: Java or Maven missing, or the jars could not be fetched.
        """
        down = [i for i in self.node_ids if self._running_pid(i) is None]
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
        if node_id not in self.node_ids:
            raise ConfigurationError(f"no node {node_id}: the nodes are {self.node_ids}")
        if self._running_pid(node_id) is not None:
            raise BrokerError(f"node {node_id} already runs")
        return self._start([node_id], timeout)

    def _start(self, node_ids: list[int], timeout: float) -> ClusterStatus:
        # Imported here: status and stop work without the cryptography package.
        from txbridge.tools.local import certs

        started_at = time.monotonic()
        state = self._ensure_state()
        ports = self._ports()
        for node_id in node_ids:
            for name, port in vars(ports[node_id]).items():
                if port_in_use(self.host, port):
                    raise BrokerError(
                        f"node {node_id}'s {name} port {port} on {self.host} is taken by another process: "
                        f"stop what listens there, or delete {self.home} to pick new ports"
                    )
        classpath = jars.kafka_classpath()
        everything_down = len(node_ids) == len(self.node_ids)
        tls_folder = self.home / "tls"
        # Re-issue certificates only when no node runs: a running node trusts the old CA.
        if everything_down:
            tls = certs.ensure_cluster_tls(tls_folder, self.node_ids)
        else:
            tls = certs.cluster_tls_paths(tls_folder, self.node_ids)
        self._ensure_passwords(any(self._is_formatted(i) for i in self.node_ids))
        self._write_client_files()
        for node_id in node_ids:
            self._write_node_files(node_id, self._node_config(node_id, ports, tls))
        unformatted = [i for i in node_ids if not self._is_formatted(i)]
        if unformatted:
            self._format(classpath, state["cluster_id"], unformatted)
        for node_id in node_ids:
            self._launch(node_id, classpath)
        logger.info(
            "starting nodes %s of the secured Kafka %s at %s (logs under %s)",
            node_ids,
            jars.KAFKA_VERSION,
            self.bootstrap,
            self.home,
        )
        try:
            self._wait_ready(node_ids, timeout)
        except BrokerError:
            self._kill(node_ids)
            raise
        logger.info("nodes %s are up in %.1fs", node_ids, time.monotonic() - started_at)
        return self.status()

    def _launch(self, node_id: int, classpath: str) -> None:
        folder = self._node_dir(node_id)
        log = self.log_file(node_id)
        self._log_offsets[node_id] = log.stat().st_size if log.is_file() else 0
        with (folder / "logs" / "stdout.log").open("wb") as stdout:
            process = subprocess.Popen(
                self._java(node_id, classpath, "kafka.Kafka", str(folder / "server.properties"), server=True),
                stdout=stdout,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._processes[node_id] = process
        self._pid_file(node_id).write_text(str(process.pid))

    def _exited(self, node_id: int) -> int | None:
        """The exit code of a node this object started and that died, else None."""
        process = self._processes.get(node_id)
        if process is not None:
            return process.poll()
        return None if self._running_pid(node_id) is not None else -1

    def _wait_ready(self, node_ids: list[int], timeout: float) -> None:
        """Wait until every node is registered and unfenced, as an authenticated client sees it,
        and each of ``node_ids`` serves clients itself (:meth:`_serving`)."""
        from txbridge import kafka
        from txbridge.kafka import KafkaException

        watch = StartupWatch(
            [self.log_file(i) for i in node_ids], timeout, f"the local cluster's nodes {node_ids}"
        )
        # Quiet: refused connections and failed handshakes are expected while the nodes start.
        quiet = {**self.client_config(), "log_level": 0}
        admin = kafka.admin(self.bootstrap, quiet)
        ports = self._ports()
        # One client per node, bootstrapped on that node alone: until the node answers, it is
        # the only broker the client knows, so an answer comes from that node.
        alone = {i: kafka.admin(f"{self.host}:{ports[i].client}", quiet) for i in node_ids}
        serving: set[int] = set()
        while True:
            for node_id in node_ids:
                code = self._exited(node_id)
                if code is not None:
                    self._pid_file(node_id).unlink(missing_ok=True)
                    raise BrokerError(
                        f"node {node_id} of the local cluster exited with code {code} during start-up; "
                        f"log {self.log_file(node_id)}:\n{self.log_tail(node_id)}"
                    )
            try:
                brokers = set(admin.list_topics(timeout=2.0).brokers)
            except KafkaException:
                brokers = set()
            serving |= {i for i in set(node_ids) - serving if self._serving(alone[i])}
            if brokers >= set(self.node_ids) and serving >= set(node_ids):
                return
            if watch.hung():
                missing = sorted(set(self.node_ids) - brokers) or sorted(set(node_ids) - serving)
                raise BrokerError(
                    f"nodes {missing} of the local cluster did not join, and wrote nothing to their logs "
                    f"for {timeout:.0f}s "
                    f"(an authenticated client at {self.bootstrap} sees nodes {sorted(brokers)}, "
                    f"nodes {sorted(serving)} of {node_ids} serve clients); "
                    f"log {self.log_file(missing[0])}:\n{self.log_tail(missing[0])}"
                )
            time.sleep(0.5)

    @staticmethod
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

    def _await_exit(self, node_id: int, pid: int, timeout: float) -> None:
        """Wait up to ``timeout`` for ``pid`` to exit, then SIGKILL it; forget the node's pid."""
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            logger.warning("node %d (pid %d) did not stop in %.0fs; killing it", node_id, pid, timeout)
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.1)
        process = self._processes.pop(node_id, None)
        if process is not None:
            process.wait(timeout=5)
        self._pid_file(node_id).unlink(missing_ok=True)

    def _kill(self, node_ids: list[int]) -> None:
        for node_id in node_ids:
            pid = self._running_pid(node_id)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                self._await_exit(node_id, pid, 10.0)

    def kill_node(self, node_id: int) -> bool:
        """SIGKILL one node, as a crash would. False if it was not running."""
        if node_id not in self.node_ids:
            raise ConfigurationError(f"no node {node_id}: the nodes are {self.node_ids}")
        was_running = self._running_pid(node_id) is not None
        self._kill([node_id])
        return was_running

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop every node: SIGTERM to all at once, SIGKILL to any still alive after ``timeout``.

        Returns:
            False when no node was running.
        """
        pids = {i: pid for i in self.node_ids if (pid := self._running_pid(i)) is not None}
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node_id, pid in pids.items():
            self._await_exit(node_id, pid, max(0.0, deadline - time.monotonic()))
        for node_id in self.node_ids:
            self._pid_file(node_id).unlink(missing_ok=True)
        return bool(pids)
