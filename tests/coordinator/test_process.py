"""The coordinator as a process: CLI errors, SIGTERM, metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from cli.main import main
from servers.broker import free_port
from tests.coordinator.conftest import SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.wire import TxState, is_owner_key, is_positions_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_bad_setting_fails_fast_naming_it(env: Env) -> None:
    result = CliRunner().invoke(main, ["coordinator", "--bootstrap", env.bootstrap, "--max-checks", "0"])
    assert result.exit_code == 2
    assert "max_checks must be at least 1" in result.output


def test_sigterm_commits_pending_state_and_exits_cleanly(env: Env, tmp_path: Path) -> None:
    log = tmp_path / "coordinator.log"
    args = [sys.executable, "-m", "coordinator", "--bootstrap", env.bootstrap, "--namespace", env.namespace]
    args += ["--group-id", f"coord-{env.namespace}", "--check-delay", "60", "--log-interval", "0.3"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TXBRIDGE_DEFAULT_SECRET": SECRET},
        )
    try:
        assert eventually(lambda: "assigned partitions" in log.read_text(), timeout=60), log.read_text()
        tx_id = env.producer.transaction([Msg("never-published", b"v")], TxState.UNKNOWN)
        assert eventually(lambda: "pending=1 " in log.read_text(), timeout=30), log.read_text()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # A young transaction (not yet due for a check) is carried in the committed half offset, not
    # in <ns>_state; `admin pending` shows both kinds.
    state = read_topic(env.bootstrap, env.topics.state)
    entries = [s for s in state if not is_positions_key(s.key) and not is_owner_key(s.key)]
    assert [s.value for s in entries if s.value] == []
    admin_args = ["admin", "pending", "--bootstrap", env.bootstrap, "--namespace", env.namespace]
    pending = CliRunner().invoke(main, [*admin_args, "--group-id", f"coord-{env.namespace}"])
    assert pending.exit_code == 0, pending.output
    assert tx_id in pending.output
    assert "open" in pending.output
    assert "stopped" in log.read_text()
    assert "test-secret" not in log.read_text()


def test_metrics_are_served(env: Env, topic_factory: Callable[..., str]) -> None:
    topic = topic_factory()
    port = free_port()
    env.start(metrics_port=port)
    env.producer.transaction([Msg(topic, b"v")], TxState.COMMIT)
    wait_for(env.bootstrap, topic, 1)

    def scrape() -> str:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return text if "txbridge_coordinator_resolved_published_total 1.0" in text else ""

    text = eventually(scrape)
    assert "txbridge_coordinator_resolved_published_total 1.0" in text
    assert "txbridge_coordinator_assigned_partitions 3.0" in text
