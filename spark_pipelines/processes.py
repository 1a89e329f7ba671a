"""Child processes of a run: the producer processes of each path and the coordinator.

Crashes are real: the runner SIGKILLs a producer process at its planned crash
point and starts a fresh one for the remaining orders; the coordinator (launched
by :class:`servers.coordinator_process.CoordinatorProcess`, as ``txbridge bench`` does) is
SIGKILLed once mid-run and restarted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from servers.coordinator_process import CoordinatorProcess
from spark_pipelines.faults import FaultPlan
from spark_pipelines.workload import SECRET_ENV, RunConfig
from txbridge.errors import TxBridgeError

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)


class PipelineError(TxBridgeError):
    """A producer process of the demo failed unexpectedly."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class PathResult:
    """What the service saw on one path: outcome per order index, the crashes, the processes used."""

    path: str
    outcomes: dict[int, str] = field(default_factory=dict)
    crashes: list[tuple[int, str]] = field(default_factory=list)
    processes: int = 0


class StartLine:
    """Where the paths of a run begin together: once every path's first process is ready.

    :attr:`at` is the wall time they were let go; the plan's paced schedule counts from it,
    in every process of every path (a replacement after a crash too).
    """

    def __init__(self, paths: int) -> None:
        self.at = 0.0
        self._barrier = threading.Barrier(paths, action=self._mark)

    def _mark(self) -> None:
        self.at = time.time()

    def wait(self, timeout: float) -> float:
        """Wait for every path; return :attr:`at`.

        Raises:
            threading.BrokenBarrierError: a path failed before it was ready, or ``timeout``.
        """
        self._barrier.wait(timeout)
        return self.at

    def abort(self) -> None:
        """Nobody waits for the caller's path any more (it failed, or is already past)."""
        self._barrier.abort()


class ProducerRunner:
    """Run one path's orders through producer processes, killing and replacing them at crash points.

    Args:
        config: the run.
        path: ``txbridge``, ``native`` or ``plain``.
        plan: the fault plan (already saved to ``config.plan_file``).
        secret: the check secret (txbridge), passed in the environment.
        on_order: called with ``(path, index, outcome)`` after each order.
        client: the cluster's client settings, passed on the command line as the parent got them.
        start_line: shared by the runners of a run: each path's first process begins its first
            order once every path's first process is ready (started its producer). None: at once.
    """

    #: Seconds a first process may take to become ready, and then to wait for the other paths'.
    READY_TIMEOUT_S = 120.0

    def __init__(
        self,
        config: RunConfig,
        path: str,
        plan: FaultPlan,
        *,
        secret: str | None = None,
        on_order: Callable[[str, int, str], None] | None = None,
        client: ClientConfig | None = None,
        start_line: StartLine | None = None,
    ) -> None:
        self.config = config
        self._start_line = start_line
        self._started_at = 0.0  # set when the first process goes
        self._client_args = client.cli_args() if client is not None else []
        self.path = path
        self.plan = plan
        self._secret = secret
        self.on_order = on_order
        self.result = PathResult(path)
        self._idle: subprocess.Popen[str] | None = None
        self._logs = Path(config.run_dir) / "logs"

    def _spawn(self, start: int) -> subprocess.Popen[str]:
        self._logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self._secret:
            env[SECRET_ENV] = self._secret
        self.result.processes += 1
        log = (self._logs / f"{self.path}-{self.result.processes}.log").open("w")
        try:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "spark_pipelines.worker",
                    self.config.run_dir,
                    self.path,
                    str(start),
                    *self._client_args,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        finally:
            log.close()

    def run(self) -> PathResult:
        """Handle every order; return when the last process is idle (it keeps answering back-checks).

        Raises:
            PipelineError: a producer process died without being killed by the plan.
        """
        start = 0
        try:
            while True:
                # After a kill at the last order a process still starts: it has no order left,
                # but it answers the back-checks of what the killed one left open.
                proc = self._spawn(start)
                start, done = self._follow(proc, start)
                if done:
                    self._idle = proc
                    return self.result
        finally:
            if self._start_line is not None:
                self._start_line.abort()  # whatever happened, nobody waits for this path now

    def _go(self, proc: subprocess.Popen[str]) -> None:
        """Let a ready process begin: the first one once every path's first one is ready; each
        is told when the run began, which its paced schedule counts from."""
        line, self._start_line = self._start_line, None
        if not self._started_at:
            try:
                self._started_at = line.wait(self.READY_TIMEOUT_S) if line is not None else time.time()
            except threading.BrokenBarrierError:
                proc.kill()  # it waits for its go: it must not run alone, nor outlive the run
                proc.wait(30)
                raise PipelineError(
                    f"{self.path}: the other paths' producers did not start within "
                    f"{self.READY_TIMEOUT_S:.0f}s (see their logs under {self._logs})"
                ) from None
        assert proc.stdin is not None
        proc.stdin.write(f"go {self._started_at!r}\n")
        proc.stdin.flush()

    def _follow(self, proc: subprocess.Popen[str], start: int) -> tuple[int, bool]:
        stdout: IO[str] = proc.stdout  # type: ignore[assignment]
        for line in stdout:
            message = json.loads(line)
            if message.get("ready"):
                self._go(proc)
            elif "order" in message:
                index = int(message["order"])
                self.result.outcomes[index] = message["outcome"]
                start = index + 1
                if self.on_order:
                    self.on_order(self.path, index, message["outcome"])
            elif "crash" in message:
                index = int(message["crash"])
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                self.result.crashes.append((index, message["stage"]))
                self.result.outcomes[index] = f"killed_{message['stage']}"
                logger.info(
                    "%s: killed producer pid %d at order %d (%s)",
                    self.path,
                    proc.pid,
                    index,
                    message["stage"],
                )
                if self.on_order:
                    self.on_order(self.path, index, self.result.outcomes[index])
                return index + 1, False
            elif message.get("done"):
                return len(self.plan.orders), True
        code = proc.wait(30)
        log = self._logs / f"{self.path}-{self.result.processes}.log"
        raise PipelineError(
            f"{self.path} producer exited with code {code} at order {start}; log {log}:\n{_tail(log)}"
        )

    def finish(self, timeout: float = 30.0) -> None:
        """Let the idle process close its producer and exit."""
        proc, self._idle = self._idle, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        finally:
            if proc.stdout:
                proc.stdout.close()

    def kill(self) -> None:
        """Kill the idle process, if any (clean-up after a failure)."""
        if self._idle is not None and self._idle.poll() is None:
            self._idle.kill()
            self._idle.wait(10)
        self._idle = None


def coordinator_process(
    config: RunConfig, secret: str, *, check_delay: float = 2.0, client: ClientConfig | None = None
) -> CoordinatorProcess:
    """The run's coordinator on its namespace; its log is ``logs/coordinator.log`` of the run.

    Args:
        config: the run.
        secret: the default check secret (passed in the child's environment).
        check_delay: seconds before the first back-check.
        client: the cluster's client settings (``--command-config`` / ``-X`` of the child).
    """
    client_args = client.cli_args() if client is not None else []
    return CoordinatorProcess(
        config.bootstrap,
        config.namespace,
        secret=secret,
        log_path=Path(config.run_dir) / "logs" / "coordinator.log",
        args=("--check-delay", str(check_delay), *client_args),
        supervise=True,  # a coordinator that exits on its own is started again, as in a deployment
    )
