"""A coordinator as a child process (``python -m coordinator``), for demos, benchmarks and crash tests.

Real processes are what crash tests and failover figures need: SIGKILL leaves
no chance to clean up, exactly like a machine that dies. ``txbridge bench``
and the Spark demo (``spark_pipelines``) both launch coordinators through
:class:`CoordinatorProcess`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from txbridge.errors import TxBridgeError

logger = logging.getLogger(__name__)

#: The line the coordinator logs once partitions are assigned to it.
READY_MARK = "assigned partitions"
#: A supervisor's wait before it starts an exited coordinator again: Docker's first restart
#: delay (compose/ runs it with ``restart: unless-stopped``; the delay doubles from 100 ms).
RESTART_DELAY_S = 0.1


class CoordinatorProcessError(TxBridgeError):
    """A coordinator child process exited or did not become ready."""


class CoordinatorProcess:
    """One ``python -m coordinator`` child with its log in ``log_path``.

    The child can be SIGKILLed and started again (:meth:`crash_and_restart`):
    every start appends to the same log, and :meth:`wait_ready` counts only what
    the current start logged. ``starts`` and ``kills`` count what happened.

    Args:
        bootstrap: Kafka bootstrap servers.
        namespace: the internal topic prefix.
        secret: the default back-check secret (passed through the environment, never argv).
        log_path: where the child's output goes.
        args: further coordinator flags, e.g. ``("--check-delay", "1")``.
        instance_id: the child's ``--instance-id``, the same at every (re)start, so a restart
            keeps its partitions without a rebalance (static membership);
            default: one of its own (several children on one host must not share one).
        supervise: restart a child that exits on its own, as a deployment's supervisor does
            (``restart: unless-stopped`` in compose/; the coordinator exits 75 when a Kafka call
            outlives its watchdog and expects to be started again): after
            :data:`RESTART_DELAY_S`, doubling up to 30 s while it keeps exiting. What
            :meth:`kill`, :meth:`crash_and_restart` and :meth:`stop` end is not restarted.
            Each such exit is in :attr:`exits`.
        stall_dump_s: when it supervises, a child whose log stays silent this long (the
            coordinator logs its counts every ``--log-interval``) gets SIGUSR1, which makes it
            write every thread's stack to its log: where a stuck coordinator waits. At most
            once a minute, never while :meth:`pause` holds it; each dump is in :attr:`stall_dumps`.
    """

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        *,
        secret: str,
        log_path: Path,
        args: Sequence[str] = (),
        instance_id: str | None = None,
        supervise: bool = False,
        stall_dump_s: float | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.log_path = Path(log_path)
        self.args = tuple(args)
        if "--instance-id" not in self.args:
            self.args += ("--instance-id", instance_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
        self._secret = secret
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # the log's size when the current child started
        self._lock = threading.Lock()  # start, kill and stop may come from different threads
        self._stopped = False
        self._supervise = supervise
        self._ended_by_us = False  # the current child was SIGKILLed or stopped by this launcher
        self._supervisor: threading.Thread | None = None
        self._started_at = 0.0  # monotonic time of the current child's start
        self._stall_dump_s = stall_dump_s
        self._paused = False  # SIGSTOPped by pause(): silent on purpose
        self._awake_since = 0.0  # wall time since which the child could have logged
        self._last_dump = 0.0  # wall time of the last SIGUSR1
        #: Children started so far.
        self.starts = 0
        #: Children SIGKILLed so far.
        self.kills = 0
        #: (wall time of the SIGKILL, wall time the restarted child was assigned partitions) per
        #: :meth:`crash_and_restart`: the coordinator's downtime.
        self.outages: list[tuple[float, float]] = []
        #: (wall time, exit code, the child's last log lines) per exit this launcher did not cause,
        #: when it supervises (``supervise``).
        self.exits: list[tuple[float, int | None, str]] = []
        #: Wall time of each SIGUSR1 sent to a silent child (``stall_dump_s``).
        self.stall_dumps: list[float] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> CoordinatorProcess:
        """Start the child (it has not joined its group yet: see :meth:`wait_ready`).

        Raises:
            CoordinatorProcessError: this one's child is still running.
        """
        with self._lock:
            self._stopped = False
            self._start()
            if self._supervise and (self._supervisor is None or not self._supervisor.is_alive()):
                self._supervisor = threading.Thread(
                    target=self._restart_exited, name="coordinator-supervisor", daemon=True
                )
                self._supervisor.start()
        return self

    def _restart_exited(self) -> None:
        """Start the child again whenever it exits on its own, until :meth:`stop`; have a silent
        one dump its stacks (``stall_dump_s``)."""
        backoff = RESTART_DELAY_S
        while True:
            time.sleep(0.2)
            with self._lock:
                if self._stopped:
                    return
                proc = self._proc
                if proc is None or self._ended_by_us:
                    continue
                if proc.poll() is None:
                    self._dump_if_silent(proc.pid)
                    continue
                tail = self.log_tail(6)
                self.exits.append((time.time(), proc.returncode, tail))
                self._ended_by_us = True  # on record: the next pass waits for the restart below
                if time.monotonic() - self._started_at > 60:  # it ran a while: not a crash loop
                    backoff = RESTART_DELAY_S
            logger.warning(
                "coordinator pid %d exited on its own (code %s); starting it again in %.1fs:\n%s",
                proc.pid,
                proc.returncode,
                backoff,
                tail,
            )
            time.sleep(backoff)
            with self._lock:
                if self._stopped or self.alive():
                    continue
                self._start()
            backoff = min(backoff * 2, 30.0)

    def _dump_if_silent(self, pid: int) -> None:
        if self._stall_dump_s is None or self._paused:
            return
        now = time.time()
        try:
            stat = self.log_path.stat()
        except FileNotFoundError:
            return
        if stat.st_size <= self._log_offset:
            # Not a line from this child yet: it is still importing, before its SIGUSR1 handler,
            # and SIGUSR1's default action would end it (seen in CI on a slow box: exit -10).
            return
        silent = now - max(stat.st_mtime, self._awake_since)
        if silent > self._stall_dump_s and now - self._last_dump > 60:
            logger.warning("coordinator pid %d logged nothing for %.0fs: stacks to its log", pid, silent)
            os.kill(pid, signal.SIGUSR1)
            self._last_dump = now
            self.stall_dumps.append(now)

    def _start(self) -> None:
        if self.alive():
            raise CoordinatorProcessError(f"the coordinator (pid {self.pid}) is already running")
        self._ended_by_us = False
        self._paused = False
        self._started_at = time.monotonic()
        self._awake_since = time.time()
        cmd = [
            sys.executable,
            "-m",
            "coordinator",
            "--bootstrap",
            self.bootstrap,
            "--namespace",
            self.namespace,
            *self.args,
        ]
        env = {**os.environ, "TXBRIDGE_DEFAULT_SECRET": self._secret}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.starts += 1
        logger.info("coordinator child pid %d started (log %s)", self._proc.pid, self.log_path)

    def current_log(self) -> str:
        """What the current child has logged so far (not its predecessors' lines)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines the current child logged."""
        return "\n".join(self.current_log().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 60.0, *, marks: int = 1, poll_s: float = 0.1) -> None:
        """Wait until the current child has logged ``marks`` partition assignments.

        Raises:
            CoordinatorProcessError: the child exited, or was not assigned in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self._proc.returncode if self._proc else None
                raise CoordinatorProcessError(f"the coordinator exited (code {code}):\n{self.log_tail()}")
            if self.current_log().count(READY_MARK) >= marks:
                return
            time.sleep(poll_s)
        raise CoordinatorProcessError(f"the coordinator was not assigned partitions within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL: no commit, no leaving the group."""
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._ended_by_us = True
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(30)
            self.kills += 1
            logger.info("coordinator child pid %d killed", self._proc.pid)

    def pause(self) -> int | None:
        """SIGSTOP the child, as a machine that stalls (a long GC, a frozen VM) would; its pid.

        None when it is not running. It stays in its group until its session times out; the
        supervisor neither restarts it nor asks it for its stacks until :meth:`resume`.
        """
        with self._lock:
            if not self.alive():
                return None
            assert self._proc is not None
            os.kill(self._proc.pid, signal.SIGSTOP)
            self._paused = True
            return self._proc.pid

    def resume(self) -> None:
        """SIGCONT the child :meth:`pause` stopped."""
        with self._lock:
            if self._paused and self._proc is not None and self._proc.poll() is None:
                os.kill(self._proc.pid, signal.SIGCONT)
            self._paused = False
            self._awake_since = time.time()

    def crash_and_restart(self, downtime: float = RESTART_DELAY_S, *, ready_timeout: float = 60.0) -> None:
        """SIGKILL the child, wait ``downtime`` seconds, start a fresh one and wait until it is ready.

        Does nothing once :meth:`stop` has been called (a restart racing the end of a run).

        Raises:
            CoordinatorProcessError: the fresh child exited, or was not assigned in time
                (unless :meth:`stop` ended it meanwhile).
        """
        with self._lock:
            if self._stopped:
                return
            killed = time.time()
            self._kill()
            time.sleep(downtime)
            self._start()
        try:
            self.wait_ready(ready_timeout, poll_s=0.02)
        except CoordinatorProcessError:
            if not self._stopped:
                raise
            return
        self.outages.append((killed, time.time()))

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``). Returns the exit code."""
        with self._lock:
            self._stopped = True
            self._ended_by_us = True
            proc = self._proc
            if proc is None:
                return None
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "coordinator pid %d ignored SIGTERM for %.0fs; killing it", proc.pid, timeout
                    )
                    proc.kill()
                    proc.wait(10)
            return proc.returncode

    def rss_bytes(self) -> int:
        import psutil

        if self._proc is None:
            return 0
        return int(psutil.Process(self._proc.pid).memory_info().rss)

    def __enter__(self) -> CoordinatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
