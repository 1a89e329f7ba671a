"""A coordinator as a child process (``python -m coordinator``), for demos, benchmarks and crash tests.

Real processes are what crash tests and failover figures need: SIGKILL leaves
no chance to clean up, exactly like a machine that dies.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from txbridge.errors import TxBridgeError

logger = logging.getLogger(__name__)

#: The line the coordinator logs once partitions are assigned to it.
READY_MARK = "assigned partitions"


class CoordinatorProcessError(TxBridgeError):
    """A coordinator child process exited or did not become ready."""


class CoordinatorProcess:
    """One ``python -m coordinator`` child with its log in ``log_path``.

    Args:
        bootstrap: Kafka bootstrap servers.
        namespace: the internal topic prefix.
        secret: the default back-check secret (passed through the environment, never argv).
        log_path: where the child's output goes.
        args: further coordinator flags, e.g. ``("--check-delay", "1")``.
    """

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        *,
        secret: str,
        log_path: Path,
        args: Sequence[str] = (),
    ) -> None:
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.log_path = Path(log_path)
        self.args = tuple(args)
        self._secret = secret
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> CoordinatorProcess:
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
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        logger.info("coordinator child pid %d started (log %s)", self._proc.pid, self.log_path)
        return self

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = 60.0, *, marks: int = 1) -> None:
        """Wait until the child has logged ``marks`` partition assignments.

        Raises:
            CoordinatorProcessError: the child exited, or was not assigned in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self._proc.returncode if self._proc else None
                raise CoordinatorProcessError(f"the coordinator exited (code {code}):\n{self.log_tail()}")
            if (
                self.log_path.is_file()
                and self.log_path.read_text(errors="replace").count(READY_MARK) >= marks
            ):
                return
            time.sleep(0.1)
        raise CoordinatorProcessError(f"the coordinator was not assigned partitions within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL: no commit, no leaving the group."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(30)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``). Returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("coordinator pid %d ignored SIGTERM for %.0fs; killing it", proc.pid, timeout)
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
