"""The RocketMQ demo pair in examples/: TAGA commits, TAGB rolls back, TAGC is committed by a back-check."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig, Secrets
from coordinator.service import Coordinator
from tests.kafka_helpers import wait_for
from txbridge.topics import init_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "example-secret"  # noqa: S105 - a test-only HMAC secret
PARTITIONS = 2


@pytest.fixture
def coordinator_ns(kafka_bootstrap: str) -> Iterator[str]:
    namespace = f"txbx{uuid.uuid4().hex[:10]}"
    init_topics(kafka_bootstrap, namespace, PARTITIONS)
    config = CoordinatorConfig(
        bootstrap=kafka_bootstrap,
        namespace=namespace,
        group_id=f"coord-{namespace}",
        check_delay_s=1.0,
        check_backoff_s=0.5,
        check_backoff_max_s=1.0,
        secrets=Secrets(default=SECRET),
    )
    service = Coordinator(config)
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    assert service.running.wait(60), "the coordinator got no partitions within 60s"
    yield namespace
    service.stop()
    thread.join(60)


def _example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TXBRIDGE_SECRET": SECRET},
    )


def test_rocketmq_transaction_demo_ends_with_taga_and_tagc(
    kafka_bootstrap: str,
    coordinator_ns: str,
    topic_factory: Callable[..., str],
    group_factory: Callable[[], str],
) -> None:
    topic = topic_factory(partitions=2)
    common = ["--bootstrap", kafka_bootstrap, "--topic", topic]

    produced = _example(
        "rocketmq_transaction_producer.py", *common, "--namespace", coordinator_ns,
        "--partitions", str(PARTITIONS), "--check-after", "1",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert "TAGC: tx" in produced.stdout
    assert "back-check of" in produced.stdout
    assert len(wait_for(kafka_bootstrap, topic, 2)) == 2

    consumed = _example(
        "rocketmq_orderly_consumer.py", *common, "--group", group_factory(), "--idle-exit", "5"
    )

    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [
        f"topic={topic} tag=TAGA body=Hello txbridge 0",
        f"topic={topic} tag=TAGC body=Hello txbridge 2",
    ]
