"""A single-node Apache Kafka (KRaft, broker + controller) on 127.0.0.1.

It is the embedded default of the demo, the tests and the benchmarks. The broker
runs from the Maven Central jars (:mod:`servers.jars`), with replication
factor and min ISR 1 for the internal topics so transactions work on one node.

Layout of ``home`` (``.cache/kafka`` by default)::

    server.properties  log4j2.properties  data/  logs/broker.log  broker.pid  broker.json
"""

from __future__ import annotations

import base64
import json
import logging
import random
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers import jars
from servers.processes import read_pid, spawn, terminate
from servers.startup import StartupWatch
from txbridge.errors import BrokerError, KafkaUnavailableError

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093

#: Segment size of ``__transaction_state`` and ``__consumer_offsets`` on the local brokers.
#: Kafka's 100 MB default suits a broker whose internal topics see traffic from many clients;
#: here the data directory lives across every test, demo and bench run of a checkout, and a
#: segment is compacted only once rolled. With the default, a day's runs leave large
#: never-rolled segments that each start replays, and ``init_transactions`` waits
#: ("coordinator load in progress") for seconds after ``txbridge kafka start`` returns
#: (docs/results/settings.md).
INTERNAL_SEGMENT_BYTES = 8 * 1024 * 1024
#: The broker settings that give newly created internal topics those segments.
INTERNAL_SEGMENTS = {
    "transaction.state.log.segment.bytes": str(INTERNAL_SEGMENT_BYTES),
    "offsets.topic.segment.bytes": str(INTERNAL_SEGMENT_BYTES),
}
_INTERNAL_TOPICS = ("__transaction_state", "__consumer_offsets")


#: Where Linux takes the local ports of outgoing connections when it cannot read its setting.
_LINUX_EPHEMERAL = (32768, 60999)
#: The lowest port :func:`free_port` hands out: below it live the well-known defaults
#: (Kafka's 9092, RocketMQ's 9876, 8080, ...).
_LOWEST = 10_000
#: Ports this process has handed out, so two servers it starts never get the same one.
_handed_out: set[int] = set()
_REMEMBERED = 5_000  # of the 22,768 ports below Linux's default ephemeral range
_random = random.SystemRandom()  # a seeded demo (random.seed) must not pick the same ports twice


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _LINUX_EPHEMERAL


def _listen_range() -> range:
    """The ports no outgoing connection is given: those below the kernel's ephemeral range."""
    low, high = _ephemeral_range()
    if low - _LOWEST >= 1_000:
        return range(_LOWEST, low)
    return range(high + 1, 65_536) if high < 64_000 else range(0)


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``port`` now.

    A bind test, unlike :func:`port_in_use`: it also sees a port that an outgoing
    connection holds as its local port, which nothing listens on.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM's servers bind
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", *, neighbours: tuple[int, ...] = ()) -> int:
    """A TCP port that is free now and that no outgoing connection will take before a server binds it.

    A port the OS picks with ``bind(0)`` comes from the ephemeral range, where the kernel
    also takes the local ports of outgoing connections (Linux gives ``bind(0)`` odd ports
    and ``connect()`` even ones, so ``port + 1`` is the likeliest to go): between the pick
    and the server's bind, seconds of JVM start-up later, any client on the machine could
    take it. So the port comes from below that range, where only a listening server can
    take it, and is not one this process has handed out already.

    Args:
        host: the address the server will bind.
        neighbours: offsets of ports the server also binds, which must be free too
            (RocketMQ's broker takes ``port - 2`` and ``port + 1``).

    Raises:
        BrokerError: no such port found in 200 tries.
    """
    ports = _listen_range()
    if not ports:  # the ephemeral range covers everything: let the OS choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    if len(_handed_out) > _REMEMBERED:  # a long-lived process: start afresh
        _handed_out.clear()
    for _ in range(200):
        port = _random.choice(ports)
        wanted = [port + offset for offset in (0, *neighbours)]
        if all(p in ports and p not in _handed_out and port_free(host, p) for p in wanted):
            _handed_out.update(wanted)
            return port
    raise BrokerError(
        f"found no free port on {host} between {ports.start} and {ports.stop - 1} "
        f"(with the ports at offsets {list(neighbours)} free too)"
    )


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _cluster_id() -> str:
    # Kafka's Uuid string form: URL-safe base64 of 16 bytes, unpadded, not starting with '-'.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    log_file: Path


class LocalKafka:
    """Start, stop and inspect the local single-node broker.

    No I/O happens in the constructor. ``start()`` fetches the jars (once),
    formats the log dir (once) and waits until the broker answers an admin request.

    Args:
        home: folder for config, data, logs and the pid file.
        port: the client listener's port.
        controller_port: the KRaft controller's port.
        host: the address both listeners bind to.
        heap: the JVM's maximum heap.
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        port: int = DEFAULT_PORT,
        controller_port: int = DEFAULT_CONTROLLER_PORT,
        host: str = "127.0.0.1",
        heap: str = "1g",
    ) -> None:
        self.home = Path(home) if home else jars.cache_root() / "kafka"
        self.port = port
        self.controller_port = controller_port
        self.host = host
        self.heap = heap
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "broker.log"

    @property
    def _pid_file(self) -> Path:
        return self.home / "broker.pid"

    @classmethod
    def from_home(cls, home: Path | None = None) -> LocalKafka:
        """The broker last started in ``home``, with the ports it was started on."""
        broker = cls(home)
        info = broker.home / "broker.json"
        if info.is_file():
            data = json.loads(info.read_text())
            broker = cls(home, port=data["port"], controller_port=data["controller_port"], host=data["host"])
        return broker

    def _running_pid(self) -> int | None:
        return read_pid(self._pid_file)

    def status(self) -> BrokerStatus:
        pid = self._running_pid()
        return BrokerStatus(pid is not None, pid, self.bootstrap, self.log_file)

    def _write_config(self) -> Path:
        data = self.home / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            # One node: every internal topic must accept one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            **INTERNAL_SEGMENTS,
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
        }
        text = "\n".join(f"{k}={v}" for k, v in props.items()) + "\n"
        (self.home / "server.properties").write_text(text)
        (self.home / "log4j2.properties").write_text(
            "rootLogger.level=INFO\n"
            "rootLogger.appenderRef.file.ref=FILE\n"
            "appender.file.type=File\n"
            "appender.file.name=FILE\n"
            f"appender.file.fileName={self.log_file}\n"
            "appender.file.layout.type=PatternLayout\n"
            "appender.file.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=INFO\n"
            "logger.state.name=state.change.logger\nlogger.state.level=WARN\n"
        )
        return self.home / "server.properties"

    def _java(self, classpath: str, *args: str, server: bool = False) -> list[str]:
        return java_command(self.heap, self.home / "log4j2.properties", classpath, *args, server=server)

    def _format(self, classpath: str, config: Path) -> None:
        if (self.home / "data" / "meta.properties").is_file():
            return
        result = subprocess.run(
            self._java(
                classpath, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise BrokerError(f"formatting {self.home / 'data'} failed: {result.stdout}{result.stderr}")

    def log_tail(self, lines: int = 20) -> str:
        parts = []
        for path in (self.home / "logs" / "stdout.log", self.log_file):
            if path.is_file():
                parts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(parts[-lines:])

    def start(self, *, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker in the background and wait until it answers.

        ``timeout``: how long it may go without answering and without writing to its logs (a
        large data directory takes minutes to recover, and says so as it goes).

        Raises:
            BrokerError: already running, a port is taken, or the broker died or
                went ``timeout`` without answering or logging (the log's tail is in the message).
            SetupError: Java or Maven missing, or the jars could not be fetched.
        """
        pid = self._running_pid()
        if pid is not None:
            raise BrokerError(
                f"a local broker already runs from {self.home} (pid {pid}, {self.bootstrap}); "
                "stop it with 'txbridge kafka stop'"
            )
        for name, port in (("port", self.port), ("controller port", self.controller_port)):
            if port_in_use(self.host, port):
                raise BrokerError(
                    f"{name} {port} on {self.host} is taken by another process; "
                    f"choose another with --{name.replace(' ', '-')} or stop what listens there"
                )
        classpath = jars.kafka_classpath()
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        self._format(classpath, config)
        self._process = spawn(
            self._java(classpath, "kafka.Kafka", str(config), server=True),
            self.home / "logs" / "stdout.log",
            self._pid_file,
        )
        (self.home / "broker.json").write_text(
            json.dumps({"host": self.host, "port": self.port, "controller_port": self.controller_port})
        )
        logger.info("starting Kafka %s at %s (log %s)", jars.kafka_version(), self.bootstrap, self.log_file)
        self._wait_ready(timeout)
        shrink_internal_segments(self.bootstrap)
        return self.status()

    def _wait_ready(self, timeout: float) -> None:
        from txbridge.kafka import check_reachable

        assert self._process is not None
        logs = self.home / "logs"
        watch = StartupWatch(
            [self.log_file, logs / "stdout.log"], timeout, f"the local broker at {self.bootstrap}"
        )
        while True:
            code = self._process.poll()
            if code is not None:
                self._pid_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"the local broker exited with code {code} during start-up; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            try:
                check_reachable(self.bootstrap, timeout=2.0)
            except KafkaUnavailableError:
                if watch.hung():
                    self.stop()
                    raise BrokerError(
                        f"the local broker did not answer at {self.bootstrap}, and wrote nothing to its log "
                        f"for {timeout:.0f}s; log {self.log_file}:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.5)
            else:
                return

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout``). False if none ran."""
        pid = self._running_pid()
        if pid is None:
            self._pid_file.unlink(missing_ok=True)
            return False
        terminate(pid, timeout, what="the local broker")
        if self._process is not None:
            self._process.wait(timeout=5)
        self._pid_file.unlink(missing_ok=True)
        return True


def shrink_internal_segments(bootstrap: str, extra: Mapping[str, Any] | None = None) -> list[str]:
    """Give existing internal topics :data:`INTERNAL_SEGMENT_BYTES` segments; returns those changed.

    The broker settings (:data:`INTERNAL_SEGMENTS`) apply when Kafka creates the topics: a data
    directory made before them keeps 100 MB segments. Their next append rolls the segment, and
    the cleaner compacts it. A broker that refuses is left as it is, with a warning: it works.
    """
    from txbridge import kafka

    try:
        changed = kafka.lower_topic_setting(
            bootstrap, _INTERNAL_TOPICS, "segment.bytes", INTERNAL_SEGMENT_BYTES, extra=extra
        )
    except Exception as exc:
        logger.warning("could not lower the segment size of %s: %s", ", ".join(_INTERNAL_TOPICS), exc)
        return []
    for topic in changed:
        logger.info("%s: segment.bytes lowered to %d", topic, INTERNAL_SEGMENT_BYTES)
    return changed


def java_command(
    heap: str, log4j: Path, classpath: str, *args: str, server: bool = False, tool_heap: str = "64m"
) -> list[str]:
    """A Kafka JVM's command line; ``server``: a broker, else a tool (storage format, a CLI).

    A broker gets what kafka-server-start.sh gives it: a fixed heap and short G1 pauses (a
    growing heap pauses it under the benchmark's load).
    """
    return [
        "java",
        f"-Xmx{heap}",
        f"-Xms{heap}" if server else f"-Xms{tool_heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath,
        *args,
    ]
