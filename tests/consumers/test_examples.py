"""examples/README.md's RocketMQ demo, run as written: init, a coordinator, the producer, the consumer.

The real processes the README starts (``txbridge ...``, ``python examples/...`` from the venv),
against the test broker through ``KAFKA_BOOTSTRAP_SERVERS``. Only what keeps runs apart on a
shared broker is added (a namespace, topic and groups of their own) and a shorter back-check wait.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: its txbridge and python
STEPS = [
    "txbridge init",
    "txbridge coordinator --secret demo-tx=change-me",
    "python examples/rocketmq_transaction_producer.py",
    "python examples/rocketmq_orderly_consumer.py",
]


def readme_steps() -> list[str]:
    """The command lines of the README's step-by-step demo."""
    text = (ROOT / "examples" / "README.md").read_text()
    section = text.split("## RocketMQ's transaction demo, step by step", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def command(step: str, *isolation: str) -> list[str]:
    program, *args = shlex.split(step)
    return [str(BIN / program), *args, *isolation]


@pytest.fixture
def user_env(kafka_bootstrap: str) -> dict[str, str]:
    """The environment of someone following the README: no txbridge settings but the broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXBRIDGE_")}
    env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    return env


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def coordinator_log(tmp_path: Path) -> Path:
    return tmp_path / "coordinator.log"


@pytest.fixture
def start_coordinator(
    user_env: dict[str, str], coordinator_log: Path
) -> Iterator[Callable[[list[str]], None]]:
    """Start the README's coordinator process; wait until it has partitions; SIGTERM at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str]) -> None:
        with coordinator_log.open("wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=user_env, stdout=log, stderr=subprocess.STDOUT)
        started.append(proc)
        deadline = time.monotonic() + 60
        while "assigned partitions" not in coordinator_log.read_text():
            assert proc.poll() is None, f"the coordinator exited:\n{coordinator_log.read_text()}"
            assert time.monotonic() < deadline, f"no partitions within 60s:\n{coordinator_log.read_text()}"
            time.sleep(0.1)

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_readme_steps_end_with_taga_and_tagc_on_a_topic_nobody_created(
    user_env: dict[str, str],
    start_coordinator: Callable[[list[str]], None],
    coordinator_log: Path,
    unique_name: Callable[[str], str],
) -> None:
    assert readme_steps() == STEPS
    init, coordinator, producer, consumer = STEPS
    namespace = unique_name("readme").replace("-", "_")
    topic = unique_name("TopicTest")

    initialised = run(command(init, "--namespace", namespace), user_env)
    assert f"created  {namespace}_half" in initialised.stdout
    start_coordinator(command(coordinator, "--namespace", namespace, "--group-id", f"coord-{namespace}"))
    produced = run(
        command(producer, "--namespace", namespace, "--topic", topic, "--check-after", "1"), user_env
    )
    consumed = run(command(consumer, "--topic", topic, "--group", unique_name("demo-orderly")), user_env)

    lines = produced.stdout.splitlines()
    assert lines[0] == f"created topic {topic} (4 partitions)"
    outcomes = [line.split() for line in lines[1:4]]
    assert [(o[0], o[-1]) for o in outcomes] == [
        ("TAGA:", "COMMIT"),
        ("TAGB:", "ROLLBACK"),
        ("TAGC:", "UNKNOWN"),
    ]
    tagc_tx = outcomes[2][2]
    assert lines[4:] == [f"back-check of {tagc_tx} (attempt 1): COMMIT"]
    assert consumed.stdout.splitlines() == [
        f"topic={topic} tag=TAGA body=Hello txbridge 0",
        f"topic={topic} tag=TAGC body=Hello txbridge 2",
    ]
    log = coordinator_log.read_text()
    assert "quarantined" not in log
    assert "change-me" not in log  # the secret is never logged
