"""How each node of the local cluster is configured, and its storage formatted.

Every node is broker and controller at once; nodes prove who they are to each other with
their certificate, clients with SCRAM (the listeners are drawn in
:mod:`servers.cluster`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from servers.broker import INTERNAL_SEGMENTS, java_command
from servers.cluster_layout import ClusterLayout, NodePorts, java_properties, write_private
from servers.cluster_users import ADMIN_USER, SCRAM_LOGIN, SCRAM_MECHANISM, USERS, ClusterUsers
from txbridge.errors import BrokerError

if TYPE_CHECKING:
    from servers import certs

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class NodeSetup:
    """The nodes' config files, their Java command lines and the formatting of their storage.

    Args:
        layout: the cluster's files.
        users: its SCRAM users, whose credentials the storage records.
        heap: each node's JVM heap.
    """

    def __init__(self, layout: ClusterLayout, users: ClusterUsers, heap: str) -> None:
        self._layout = layout
        self._users = users
        self._heap = heap

    def node_config(self, node_id: int, ports: dict[int, NodePorts], tls: certs.ClusterTls) -> dict[str, str]:
        """Node ``node_id``'s ``server.properties``, its private key inline."""
        from servers import certs

        host = self._layout.host
        own = ports[node_id]
        rf, min_isr = "3", "2"
        nodes = [f"User:CN={certs.node_common_name(i)}" for i in self._layout.node_ids]
        super_users = [*nodes, f"User:{ADMIN_USER}"]
        return {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": ",".join(f"{i}@{host}:{p.controller}" for i, p in ports.items()),
            "listeners": (
                f"CLIENT://{host}:{own.client},INTERNAL://{host}:{own.internal},"
                f"CONTROLLER://{host}:{own.controller}"
            ),
            "advertised.listeners": f"CLIENT://{host}:{own.client},INTERNAL://{host}:{own.internal}",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": f"{SCRAM_LOGIN} required;",
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
            "log.dirs": str(self._layout.node_dir(node_id) / "data"),
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
            **INTERNAL_SEGMENTS,
            "group.initial.rebalance.delay.ms": "0",
            # Fewer threads than the defaults (3 network, 8 I/O): three nodes share 2 cores.
            "num.network.threads": "2",
            "num.io.threads": "4",
        }

    def write_files(self, node_id: int, config: Mapping[str, str]) -> Path:
        """Write node ``node_id``'s ``server.properties`` (0600) and its log4j2 settings."""
        folder = self._layout.node_dir(node_id)
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        server = folder / "server.properties"
        write_private(server, java_properties(config))
        (folder / "log4j2.properties").write_text(
            "rootLogger.level=INFO\n"
            "rootLogger.appenderRef.file.ref=FILE\n"
            "appender.file.type=File\n"
            "appender.file.name=FILE\n"
            f"appender.file.fileName={self._layout.log_file(node_id)}\n"
            "appender.file.layout.type=PatternLayout\n"
            "appender.file.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=INFO\n"
            "logger.state.name=state.change.logger\nlogger.state.level=WARN\n"
        )
        return server

    def java(self, node_id: int, classpath: str, *args: str, server: bool = False) -> list[str]:
        """A Java command line of node ``node_id``: the node itself (``server``) or a tool."""
        log4j = self._layout.node_dir(node_id) / "log4j2.properties"
        return java_command(self._heap, log4j, classpath, *args, server=server, tool_heap="32m")

    def format_storage(self, classpath: str, cluster_id: str, node_ids: list[int]) -> None:
        """Format the nodes' storage in parallel, recording every SCRAM user's credential."""
        # The passwords go through a 0600 argument file (java @file), never the command line
        # that every local process can read in /proc.
        password = self._users.password
        scram = [f"--add-scram {SCRAM_MECHANISM}=[name={u},password={password(u)}]" for u in USERS]
        running: dict[int, subprocess.Popen[str]] = {}
        try:
            for node_id in node_ids:
                node_args = self._layout.node_dir(node_id) / "format.args"
                server = self._layout.node_dir(node_id) / "server.properties"
                write_private(
                    node_args,
                    f"kafka.tools.StorageTool format -t {cluster_id} -c {server}\n" + "\n".join(scram) + "\n",
                )
                running[node_id] = subprocess.Popen(
                    self.java(node_id, classpath, f"@{node_args}"),
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
                        out = out.replace(self._users.password(user), "***")
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
                (self._layout.node_dir(node_id) / "format.args").unlink(missing_ok=True)
