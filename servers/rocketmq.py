"""A local Apache RocketMQ 5 (name server + proxy with its broker embedded) on 127.0.0.1.

It is the RocketMQ that txbridge is compared with. Both processes run from the
Maven Central jars (:data:`servers.jars.ROCKETMQ`) with small heaps, without
a RocketMQ distribution or ``ROCKETMQ_HOME``: ``-Drocketmq.home.dir`` points at
``home`` and ``-Duser.home`` too, so RocketMQ's own logs (``logs/rocketmqlogs/``),
the proxy's and the name server's state stay in the cache.

Layout of ``home`` (``.cache/rocketmq`` by default)::

    namesrv.properties  broker.conf  proxy.json  rocketmq.json  namesrv.pid  proxy.pid
    store/  logs/namesrv.out  logs/proxy.out  logs/rocketmqlogs/{namesrv,broker,proxy}.log

Transactions are checked much sooner than RocketMQ's defaults, so that a local
comparison sees back-checks within seconds (see :data:`TRANSACTION_SETTINGS`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servers import jars
from servers.broker import free_port, port_in_use
from servers.processes import read_pid, rss, spawn, terminate
from txbridge.errors import BrokerError

logger = logging.getLogger(__name__)

DEFAULT_NAMESRV_PORT = 9876
DEFAULT_GRPC_PORT = 8081
DEFAULT_REMOTING_PORT = 8080
DEFAULT_BROKER_PORT = 10911
CLUSTER_NAME = "DefaultCluster"
BROKER_NAME = "txbridge-broker"

#: Broker settings of transactional messages, in milliseconds. RocketMQ's defaults
#: check an undecided half message after 6 s and look every 30 s; a local comparison
#: wants a back-check within a few seconds. The op batch interval (how often COMMIT /
#: ROLLBACK op records are flushed) must stay well below the timeout: a decision
#: still in the batch when the check runs gets its transaction back-checked anyway.
TRANSACTION_SETTINGS = {
    "transactionTimeOut": 3000,  # an undecided half message is checked after 3 s
    "transactionCheckInterval": 1000,  # the check service looks every second
    "transactionCheckMax": 5,  # dropped (never delivered) after 5 unanswered checks
    "transactionOpBatchInterval": 200,
}

_READY_LINE = "rocketmq-proxy startup successfully"
_NAMESRV_READY_LINE = "The Name Server boot success"
_TOOLS_TIMEOUT_S = 60.0


def free_broker_port(host: str = "127.0.0.1") -> int:
    """A port ``p`` with ``p - 2`` and ``p + 1`` free too (the broker's fast and HA ports)."""
    return free_port(host, neighbours=(-2, 1))


@dataclass(frozen=True)
class RocketMQStatus:
    """Whether the name server and the proxy run, where, and their resident memory."""

    running: bool
    namesrv_pid: int | None
    proxy_pid: int | None
    namesrv_addr: str
    #: the gRPC endpoint clients (rocketmq-python-client) connect to.
    endpoint: str
    log_dir: Path
    namesrv_rss_bytes: int | None = None
    proxy_rss_bytes: int | None = None


class LocalRocketMQ:
    """Start, stop and inspect the local RocketMQ (name server + proxy in local mode).

    No I/O happens in the constructor. ``start()`` fetches the jars (once), writes
    the configuration and waits until the proxy says it started and the broker is
    registered with the name server.

    Args:
        home: folder for config, store, logs and the pid files.
        namesrv_port: the name server's port.
        grpc_port: the proxy's gRPC port (what clients connect to).
        remoting_port: the proxy's remoting-protocol port.
        broker_port: the embedded broker's ``listenPort``; it also takes ``port - 2``
            (fast channel) and ``port + 1`` (HA).
        host: the address clients use.
        namesrv_heap: the name server's maximum heap.
        proxy_heap: the proxy's (and broker's) maximum heap.
        transaction_settings: the broker's transaction settings (ms and counts, RocketMQ's
            names); :data:`TRANSACTION_SETTINGS` when not given.
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        namesrv_port: int = DEFAULT_NAMESRV_PORT,
        grpc_port: int = DEFAULT_GRPC_PORT,
        remoting_port: int = DEFAULT_REMOTING_PORT,
        broker_port: int = DEFAULT_BROKER_PORT,
        host: str = "127.0.0.1",
        namesrv_heap: str = "256m",
        proxy_heap: str = "512m",
        transaction_settings: Mapping[str, int] | None = None,
    ) -> None:
        self.home = Path(home) if home else jars.cache_root() / "rocketmq"
        self.namesrv_port = namesrv_port
        self.grpc_port = grpc_port
        self.remoting_port = remoting_port
        self.broker_port = broker_port
        self.host = host
        self.namesrv_heap = namesrv_heap
        self.proxy_heap = proxy_heap
        self.transaction_settings = dict(
            TRANSACTION_SETTINGS if transaction_settings is None else transaction_settings
        )
        self._processes: list[subprocess.Popen[bytes]] = []

    @classmethod
    def on_free_ports(cls, home: Path | None = None, *, host: str = "127.0.0.1") -> LocalRocketMQ:
        """An instance whose four ports the OS says are free now (tests, side-by-side runs)."""
        return cls(
            home,
            namesrv_port=free_port(host),
            grpc_port=free_port(host),
            remoting_port=free_port(host),
            broker_port=free_broker_port(host),
            host=host,
        )

    @classmethod
    def from_home(cls, home: Path | None = None) -> LocalRocketMQ:
        """The RocketMQ last started in ``home``, with the ports it was started on."""
        instance = cls(home)
        info = instance.home / "rocketmq.json"
        if info.is_file():
            data = json.loads(info.read_text())
            instance = cls(home, **data)
        return instance

    @property
    def namesrv_addr(self) -> str:
        return f"{self.host}:{self.namesrv_port}"

    @property
    def endpoint(self) -> str:
        """The proxy's gRPC address, as ``rocketmq.ClientConfiguration`` takes it."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def _pid_file(self, name: str) -> Path:
        return self.home / f"{name}.pid"

    def _running_pid(self, name: str) -> int | None:
        return read_pid(self._pid_file(name))

    def status(self) -> RocketMQStatus:
        namesrv, proxy = self._running_pid("namesrv"), self._running_pid("proxy")
        return RocketMQStatus(
            running=namesrv is not None and proxy is not None,
            namesrv_pid=namesrv,
            proxy_pid=proxy,
            namesrv_addr=self.namesrv_addr,
            endpoint=self.endpoint,
            log_dir=self.log_dir,
            namesrv_rss_bytes=rss(namesrv) if namesrv else None,
            proxy_rss_bytes=rss(proxy) if proxy else None,
        )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the stdout files and RocketMQ's own logs, newest files last."""
        parts: list[str] = []
        rmq_logs = self.log_dir / "rocketmqlogs"
        for path in (
            self.log_dir / "namesrv.out",
            rmq_logs / "broker_default.log",  # the name server's log
            rmq_logs / "broker.log",
            rmq_logs / "proxy.log",
            self.log_dir / "proxy.out",
        ):
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.extend(f"{path.name}: {line}" for line in tail if line.strip())
        return "\n".join(parts[-lines:])

    def _write_config(self) -> None:
        namesrv = {"listenPort": self.namesrv_port}
        (self.home / "namesrv.properties").write_text("".join(f"{k}={v}\n" for k, v in namesrv.items()))
        store = self.home / "store"
        broker: dict[str, object] = {
            "brokerClusterName": CLUSTER_NAME,
            "brokerName": BROKER_NAME,
            "brokerId": 0,
            "brokerIP1": self.host,
            "namesrvAddr": self.namesrv_addr,
            "listenPort": self.broker_port,
            "storePathRootDir": store,
            "storePathCommitLog": store / "commitlog",
            # 1 GB files by default; a local run needs little, and less disk is reserved.
            "mappedFileSizeCommitLog": 128 * 1024 * 1024,
            "brokerRole": "ASYNC_MASTER",
            "flushDiskType": "ASYNC_FLUSH",
            # Topics are created explicitly (a transactional one needs its message type).
            "autoCreateTopicEnable": "false",
            "autoCreateSubscriptionGroup": "true",
            **self.transaction_settings,
        }
        (self.home / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in broker.items()))
        proxy = {
            "rocketMQClusterName": CLUSTER_NAME,
            "namesrvAddr": self.namesrv_addr,
            "grpcServerPort": self.grpc_port,
            "remotingListenPort": self.remoting_port,
            "proxyMode": "local",
        }
        (self.home / "proxy.json").write_text(json.dumps(proxy, indent=2) + "\n")
        (self.home / "rocketmq.json").write_text(
            json.dumps(
                {
                    "namesrv_port": self.namesrv_port,
                    "grpc_port": self.grpc_port,
                    "remoting_port": self.remoting_port,
                    "broker_port": self.broker_port,
                    "host": self.host,
                }
            )
        )

    def _java(self, heap: str, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            # Out of memory (heap, metaspace) ends the process, so start-up fails
            # at once with the cause instead of running on without the thread that died, and the
            # JVM's crash files go to the logs, not to the current folder.
            "-XX:+ExitOnOutOfMemoryError",
            f"-XX:ErrorFile={self.log_dir}/hs_err_pid%p.log",
            f"-XX:ReplayDataFile={self.log_dir}/replay_pid%p.log",
            "-Djava.awt.headless=true",
            # No ROCKETMQ_HOME: the startup classes read this property instead,
            # and RocketMQ's logback configurations write under ${user.home}/logs.
            f"-Drocketmq.home.dir={self.home}",
            f"-Duser.home={self.home}",
            # Plain gRPC: the default "permissive" TLS mode makes an RSA certificate
            # at every start (seconds of CPU) that no local client uses.
            "-Dtls.server.mode=disabled",
            "-cp",
            jars.rocketmq_classpath(),
            main,
            *args,
        ]

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in ("ROCKETMQ_HOME", "RMQ_PROXY_HOME")}
        process = spawn(command, self.log_dir / f"{name}.out", self._pid_file(name), env=env)
        self._processes.append(process)
        return process

    def _check_ports(self) -> None:
        ports = (
            ("namesrv port", self.namesrv_port),
            ("grpc port", self.grpc_port),
            ("remoting port", self.remoting_port),
            ("broker port", self.broker_port),
            ("broker port - 2 (fast channel)", self.broker_port - 2),
            ("broker port + 1 (HA)", self.broker_port + 1),
        )
        for name, port in ports:
            if port_in_use(self.host, port):
                option = name.split(" (")[0].split(" -")[0].replace(" ", "-")
                raise BrokerError(
                    f"RocketMQ's {name} {port} on {self.host} is taken by another process; "
                    f"choose another with --{option} or stop what listens there"
                )

    def start(self, *, timeout: float = 90.0) -> RocketMQStatus:
        """Start the name server and the proxy in the background and wait until both answer.

        Raises:
            BrokerError: already running, a port is taken, or a process died or did not
                get ready within ``timeout`` (the logs' tail is in the message).
            SetupError: Java or Maven missing, or the jars could not be fetched.
        """
        status = self.status()
        if status.namesrv_pid or status.proxy_pid:
            raise BrokerError(
                f"a local RocketMQ already runs from {self.home} (name server {self.namesrv_addr}, "
                f"proxy {self.endpoint}); stop it with 'txbridge rocketmq stop'"
            )
        self._check_ports()
        jars.rocketmq_classpath()  # fetch before the clock starts
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("namesrv.out", "proxy.out"):
            (self.log_dir / stale).unlink(missing_ok=True)
        self._write_config()
        deadline = time.monotonic() + timeout
        logger.info("starting RocketMQ %s: name server %s", jars.ROCKETMQ_VERSION, self.namesrv_addr)
        namesrv = self._spawn(
            "namesrv",
            self._java(
                self.namesrv_heap,
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                "-c",
                str(self.home / "namesrv.properties"),
            ),
        )
        self._wait_for_line(namesrv, "namesrv", _NAMESRV_READY_LINE, deadline, timeout)
        logger.info("starting the RocketMQ proxy (local mode) at %s", self.endpoint)
        proxy = self._spawn(
            "proxy",
            self._java(
                self.proxy_heap,
                "org.apache.rocketmq.proxy.ProxyStartup",
                "-pm",
                "local",
                "-bc",
                str(self.home / "broker.conf"),
                "-pc",
                str(self.home / "proxy.json"),
                "-n",
                self.namesrv_addr,
            ),
        )
        self._wait_for_line(proxy, "proxy", _READY_LINE, deadline, timeout)
        self._wait_registered(deadline, timeout)
        return self.status()

    def _fail(self, message: str) -> BrokerError:
        tail = self.log_tail()
        self.stop(timeout=10)  # a process that failed start-up gets no long graceful shutdown
        return BrokerError(f"{message}; logs in {self.log_dir}:\n{tail}")

    def _wait_for_line(
        self, process: subprocess.Popen[bytes], name: str, line: str, deadline: float, timeout: float
    ) -> None:
        out = self.log_dir / f"{name}.out"
        while True:
            text = out.read_text(errors="replace") if out.is_file() else ""
            if line in text:
                return
            if _OUT_OF_MEMORY.search(text):
                # Not every out-of-memory ends the JVM (a thread that cannot start is only logged,
                # and start-up then waits forever for it): fail now, with the cause.
                raise self._fail(f"the RocketMQ {name} failed during start-up: {_cause(out)}")
            code = process.poll()
            if code is not None:
                cause = _cause(out)
                raise self._fail(
                    f"the RocketMQ {name} exited with code {code} during start-up"
                    + (f": {cause}" if cause else "")
                )
            if time.monotonic() > deadline:
                raise self._fail(f"the RocketMQ {name} did not start within {timeout:.0f}s")
            time.sleep(0.3)

    def _wait_registered(self, deadline: float, timeout: float) -> None:
        """Wait until the broker is in the name server's cluster list (one admin JVM per try)."""
        while True:
            try:
                out = self.admin("clusterList", "-n", self.namesrv_addr)
            except BrokerError as exc:
                out = str(exc)
            if BROKER_NAME in out:
                return
            if time.monotonic() > deadline:
                raise self._fail(
                    f"the RocketMQ broker did not register with the name server within {timeout:.0f}s"
                )
            time.sleep(1.0)

    def admin(self, *args: str) -> str:
        """Run one ``mqadmin`` command (``org.apache.rocketmq.tools.command.MQAdminStartup``).

        Returns:
            Its standard output.

        Raises:
            BrokerError: it exited non-zero or printed an error; its output's tail is in the message.
        """
        command = [
            "java",
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a short-lived JVM: C1 only starts faster
            f"-Drocketmq.home.dir={self.home}",
            f"-Duser.home={self.home / 'tools'}",
            "-cp",
            jars.rocketmq_classpath(),
            "org.apache.rocketmq.tools.command.MQAdminStartup",
            *args,
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_TOOLS_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"mqadmin {args[0]} did not finish in {_TOOLS_TIMEOUT_S:.0f}s") from exc
        output = result.stdout + result.stderr
        if result.returncode != 0 or "Exception" in output:
            lines = output.strip().splitlines()
            # The exception's own line says what failed (callers retry a timeout); a stack's tail
            # alone does not.
            cause = [line for line in lines if "Exception" in line][:1]
            shown = "\n".join(dict.fromkeys([*cause, *lines[-8:]]))
            raise BrokerError(f"mqadmin {args[0]} failed (exit {result.returncode}):\n{shown}")
        return result.stdout

    def create_topic(self, topic: str, *, transactional: bool = False, queues: int = 4) -> None:
        """Create (or update) ``topic`` on the cluster; ``transactional`` sets ``+message.type=TRANSACTION``.

        Raises:
            BrokerError: mqadmin refused it.
        """
        args = ["updateTopic", "-n", self.namesrv_addr, "-c", CLUSTER_NAME, "-t", topic]
        args += ["-r", str(queues), "-w", str(queues)]
        args += ["-a", f"+message.type={'TRANSACTION' if transactional else 'NORMAL'}"]
        self.admin(*args)

    def create_group(self, group: str) -> None:
        """Create (or update) the consumer group ``group`` on the cluster.

        Raises:
            BrokerError: mqadmin refused it.
        """
        self.admin("updateSubGroup", "-n", self.namesrv_addr, "-c", CLUSTER_NAME, "-g", group)

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop the proxy, then the name server (SIGTERM, SIGKILL after ``timeout``). False if none ran."""
        stopped = False
        for name in ("proxy", "namesrv"):
            pid = self._running_pid(name)
            if pid is not None:
                terminate(pid, timeout, what=f"the RocketMQ {name}")
                stopped = True
            self._pid_file(name).unlink(missing_ok=True)
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=5)
        self._processes.clear()
        return stopped


#: Lines that say the JVM ran out of memory (Java heap, metaspace, native threads, or memory for
#: the JVM itself); they name the cause better than whatever the process printed after them.
_OUT_OF_MEMORY = re.compile(
    r"OutOfMemoryError|insufficient memory for the Java Runtime|Could not reserve enough space"
    r"|Could not allocate|Native memory allocation \(\w+\) failed|pthread_create failed"
)

_JVM_LOG_PREFIX = re.compile(r"^(\[[^\]]*\])+\s*")


def _cause(out: Path) -> str | None:
    """The line of a process's stdout that says why it exited: out of memory, else its last
    exception or JVM error.

    Stack frames and "... N more" lines are skipped, so a ``Caused by: java.net.BindException``
    or the JVM's "Initial heap size set to a larger value ..." is what remains. An out-of-memory
    line wins over later ones (the crash report's file name, a second thread's error).
    """
    try:
        lines = out.read_text(errors="replace").splitlines()
    except OSError:
        return None
    causes = [line.strip().lstrip("# ") for line in lines if line.strip() and not line[:1].isspace()]
    # The JVM's own warnings start with their uptime and tags: "[12.3s][warning][os,thread] ...".
    memory = [_JVM_LOG_PREFIX.sub("", line) for line in causes if _OUT_OF_MEMORY.search(line)]
    if memory:
        return f"out of memory: {memory[0]}"
    return causes[-1] if causes else None
