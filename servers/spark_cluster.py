"""A local Spark standalone cluster (a master and its workers) on 127.0.0.1.

It runs the Spark that pyspark already ships: ``bin/spark-class`` of the pyspark
package launches ``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker`` from pyspark's own jars, so there is
nothing to download. It is where the demo and the tests check that the Spark
jobs run on executors in other JVMs (jars served by the driver, checkpoints
written by executors), not only in ``local[N]``.

Layout of ``home`` (``.cache/spark-cluster`` by default)::

    cluster.json  master.pid  worker-<n>.pid  conf/
    logs/master.out  logs/worker-<n>.out
    work/worker-<n>/app-*/<executor>/stderr   (each executor's log, and the jars it fetched)
    local/                                    (executors' scratch space)

Each daemon (master, worker) gets a small heap (``daemon_memory``); each worker
offers ``worker_cores`` cores and ``worker_memory`` to executors, which Spark
starts per application with ``spark.executor.memory`` (1g unless the
application says otherwise).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import jars
from servers.broker import free_port, port_in_use
from servers.processes import read_pid, rss, spawn, terminate
from txbridge.errors import BrokerError

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 7077
# Spark's own default (8080) is the local RocketMQ's remoting port.
DEFAULT_WEBUI_PORT = 8090

_MASTER_READY = "I have been elected leader"
_WORKER_READY = "Successfully registered with master"
_LIGHT_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (``bin/spark-class``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _tree_rss(pid: int) -> int:
    """RSS of ``pid`` and its process group (a worker's executors run in the worker's group)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.name == str(pid) or os.getpgid(int(entry.name)) == pid:
                total += rss(int(entry.name)) or 0
        except (ProcessLookupError, PermissionError):
            continue
    return total


@dataclass(frozen=True)
class SparkClusterStatus:
    """Whether the master and the workers run, where, and their memory.

    ``alive_workers`` is what the master says (its JSON page), or None when it does not answer;
    ``rss_bytes`` maps ``master`` / ``worker-<n>`` to the resident memory of that daemon, with the
    executors a worker runs at the moment.
    """

    running: bool
    master_url: str
    webui_url: str
    master_pid: int | None
    worker_pids: tuple[int | None, ...]
    alive_workers: int | None
    log_dir: Path
    rss_bytes: dict[str, int] = field(default_factory=dict)


class LocalSparkCluster:
    """Start, stop and inspect a local Spark standalone cluster.

    No I/O happens in the constructor. ``start()`` starts the master, waits until it
    leads, starts the workers and waits until the master counts them all alive.

    Args:
        home: folder for configuration, logs, pid files and the workers' work dirs.
        workers: how many workers.
        master_port: the master's RPC port (``spark://host:port``).
        webui_port: the master's web UI port (its ``/json`` page is how status counts workers).
        worker_cores: cores each worker offers.
        worker_memory: memory each worker offers to executors (at least ``spark.executor.memory``).
        daemon_memory: the heap of the master and of each worker daemon (not of executors).
        host: the address everything binds to.
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        workers: int = 2,
        master_port: int = DEFAULT_MASTER_PORT,
        webui_port: int = DEFAULT_WEBUI_PORT,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        daemon_memory: str = "256m",
        host: str = "127.0.0.1",
    ) -> None:
        self.home = Path(home) if home else jars.cache_root() / "spark-cluster"
        self.workers = workers
        self.master_port = master_port
        self.webui_port = webui_port
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.daemon_memory = daemon_memory
        self.host = host
        self._processes: list[subprocess.Popen[bytes]] = []

    @classmethod
    def on_free_ports(cls, home: Path | None = None, **kwargs: object) -> LocalSparkCluster:
        """A cluster whose master and web UI ports the OS says are free now (tests)."""
        host = str(kwargs.pop("host", "127.0.0.1"))
        return cls(home, master_port=free_port(host), webui_port=free_port(host), host=host, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_home(cls, home: Path | None = None) -> LocalSparkCluster:
        """The cluster last started in ``home``, with the settings it was started with."""
        cluster = cls(home)
        info = cluster.home / "cluster.json"
        if info.is_file():
            cluster = cls(home, **json.loads(info.read_text()))
        return cluster

    @property
    def master_url(self) -> str:
        """What ``--master`` (or ``TXBRIDGE_SPARK_MASTER``) takes."""
        return f"spark://{self.host}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def work_dir(self, worker: int) -> Path:
        """Worker ``worker``'s (1-based) work dir: ``app-*/<executor id>/`` holds each executor's log."""
        return self.home / "work" / f"worker-{worker}"

    def _names(self) -> list[str]:
        return ["master", *(f"worker-{n}" for n in range(1, self.workers + 1))]

    def _pid_file(self, name: str) -> Path:
        return self.home / f"{name}.pid"

    def _running_pid(self, name: str) -> int | None:
        return read_pid(self._pid_file(name))

    def master_state(self, timeout: float = 3.0) -> dict[str, Any] | None:
        """The master's ``/json`` page (workers, applications), or None when it does not answer."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        try:
            with opener.open(f"{self.webui_url}/json/", timeout=timeout) as response:
                state = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def status(self) -> SparkClusterStatus:
        pids = {name: self._running_pid(name) for name in self._names()}
        state = self.master_state() if pids["master"] else None
        alive = state.get("aliveworkers") if state else None
        worker_pids = tuple(pids[name] for name in self._names()[1:])
        return SparkClusterStatus(
            running=all(pid is not None for pid in pids.values()) and alive == self.workers,
            master_url=self.master_url,
            webui_url=self.webui_url,
            master_pid=pids["master"],
            worker_pids=worker_pids,
            alive_workers=alive if isinstance(alive, int) else None,
            log_dir=self.log_dir,
            rss_bytes={name: _tree_rss(pid) for name, pid in pids.items() if pid is not None},
        )

    def log_tail(self, lines: int = 12) -> str:
        """The last lines of the daemons' logs."""
        parts: list[str] = []
        for name in self._names():
            path = self.log_dir / f"{name}.out"
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.extend(f"{path.name}: {line}" for line in tail if line.strip())
        return "\n".join(parts[-lines:])

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(spark_home()),
            # Our (empty) conf dir: no spark-defaults.conf or spark-env.sh from elsewhere.
            SPARK_CONF_DIR=str(self.home / "conf"),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            # The daemons only schedule and relay: the serial collector and the C1 compiler alone
            # leave the cores to the executors (and start faster on 2 cores); the same for the
            # short-lived launcher JVM of spark-class.
            SPARK_DAEMON_JAVA_OPTS=_LIGHT_JVM,
            SPARK_LAUNCHER_OPTS=_LIGHT_JVM,
            SPARK_LOCAL_IP=self.host,
            SPARK_LOCAL_DIRS=str(self.home / "local"),
        )
        return env

    def _spawn(self, name: str, main: str, *args: str) -> subprocess.Popen[bytes]:
        # spark-class runs Spark's launcher, then execs the daemon's JVM in place: the pid is the JVM's.
        process = spawn(
            [str(spark_home() / "bin" / "spark-class"), main, *args],
            self.log_dir / f"{name}.out",
            self._pid_file(name),
            env=self._env(),
            cwd=self.home,
        )
        self._processes.append(process)
        return process

    def _check_ports(self) -> None:
        for what, option, port in (
            ("master port", "--master-port", self.master_port),
            ("master web UI port", "--webui-port", self.webui_port),
        ):
            if port_in_use(self.host, port):
                raise BrokerError(
                    f"the Spark {what} {port} on {self.host} is taken by another process; "
                    f"choose another with {option} or stop what listens there"
                )

    def start(self, *, timeout: float = 120.0) -> SparkClusterStatus:
        """Start the master and the workers in the background and wait until every worker is alive.

        Raises:
            BrokerError: already running, a port is taken, or a daemon exited or did not get
                ready within ``timeout`` (the logs' tail is in the message).
        """
        if any(self._running_pid(name) for name in self._names()):
            raise BrokerError(
                f"a local Spark cluster already runs from {self.home} ({self.master_url}); "
                "stop it with 'txbridge spark stop'"
            )
        self._check_ports()
        if not (spark_home() / "bin" / "spark-class").is_file():
            raise BrokerError(f"pyspark at {spark_home()} has no bin/spark-class: reinstall pyspark")
        for folder in ("conf", "logs", "local"):
            (self.home / folder).mkdir(parents=True, exist_ok=True)
        for name in self._names():
            (self.log_dir / f"{name}.out").unlink(missing_ok=True)
        (self.home / "cluster.json").write_text(
            json.dumps(
                {
                    "workers": self.workers,
                    "master_port": self.master_port,
                    "webui_port": self.webui_port,
                    "worker_cores": self.worker_cores,
                    "worker_memory": self.worker_memory,
                    "daemon_memory": self.daemon_memory,
                    "host": self.host,
                }
            )
        )
        deadline = time.monotonic() + timeout
        logger.info("starting the Spark master at %s", self.master_url)
        master = self._spawn(
            "master",
            _MASTER_CLASS,
            *("--host", self.host, "--port", str(self.master_port)),
            *("--webui-port", str(self.webui_port)),
        )
        self._wait_for_line(master, "master", _MASTER_READY, deadline, timeout)
        workers = []
        for n in range(1, self.workers + 1):
            self.work_dir(n).mkdir(parents=True, exist_ok=True)
            workers.append(
                self._spawn(
                    f"worker-{n}",
                    _WORKER_CLASS,
                    *("--host", self.host, "--cores", str(self.worker_cores)),
                    *("--memory", self.worker_memory, "--work-dir", str(self.work_dir(n))),
                    *("--port", "0", "--webui-port", "0"),  # any free port: only the master's are known
                    self.master_url,
                )
            )
        for n, process in enumerate(workers, 1):
            self._wait_for_line(process, f"worker-{n}", _WORKER_READY, deadline, timeout)
        while True:
            status = self.status()
            if status.running:
                return status
            if time.monotonic() > deadline:
                raise self._fail(
                    f"the Spark master counts {status.alive_workers} of {self.workers} workers alive "
                    f"after {timeout:.0f}s"
                )
            time.sleep(0.3)

    def _fail(self, message: str) -> BrokerError:
        tail = self.log_tail()
        self.stop()
        return BrokerError(f"{message}; logs in {self.log_dir}:\n{tail}")

    def _wait_for_line(
        self, process: subprocess.Popen[bytes], name: str, line: str, deadline: float, timeout: float
    ) -> None:
        out = self.log_dir / f"{name}.out"
        while True:
            if out.is_file() and line in out.read_text(errors="replace"):
                return
            code = process.poll()
            if code is not None:
                cause = _cause(out)
                raise self._fail(
                    f"the Spark {name} exited with code {code} during start-up"
                    + (f": {cause}" if cause else "")
                )
            if time.monotonic() > deadline:
                raise self._fail(f"the Spark {name} did not start within {timeout:.0f}s")
            time.sleep(0.2)

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop the workers (and their executors), then the master. False if none ran."""
        stopped = False
        for name in reversed(self._names()):
            pid = self._running_pid(name)
            if pid is not None:
                # The group: a worker's executors share its process group.
                terminate(pid, timeout, what=f"the Spark {name}", group=True)
                stopped = True
            self._pid_file(name).unlink(missing_ok=True)
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=5)
        self._processes.clear()
        return stopped


_ERROR_LINE = re.compile(r"\b(ERROR|Exception|Error)\b")
_JVM_INIT_ERROR = "Error occurred during initialization of VM"


def _cause(out: Path) -> str | None:
    """The line of a daemon's output that says why it exited: its last error, else its last line."""
    try:
        lines = [line.strip() for line in out.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    errors = [i for i, line in enumerate(lines) if _ERROR_LINE.search(line) and not line.startswith("at ")]
    if not errors:
        return lines[-1] if lines else None
    last = errors[-1]
    if lines[last] == _JVM_INIT_ERROR and last + 1 < len(lines):  # the reason is on the next line
        return f"{lines[last]}: {lines[last + 1]}"
    return lines[last]
