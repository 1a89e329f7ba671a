"""``txbridge consume``: prints what a subscription selects, fails clearly on a bad expression."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from txbridge.ordered import OrderedProducer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _txbridge(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("kind", ["orderly", "concurrent"])
def test_consume_prints_topic_tag_key_value(
    kind: str, kafka_bootstrap: str, topic_factory: Callable[..., str], group_factory: Callable[[], str]
) -> None:
    topic = topic_factory(partitions=1)
    with OrderedProducer(kafka_bootstrap) as producer:
        for tag, body in [("TAGA", "a"), ("TAGB", "b"), ("TAGC", "c"), (None, "none")]:
            producer.send(topic, body.encode(), key=b"k", tags=tag)

    done = _txbridge(
        "consume", kind, "--bootstrap", kafka_bootstrap, "--topic", topic, "--group", group_factory(),
        "--subscription", "TAGA || TAGC", "--max-messages", "2",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert lines == [f"topic={topic} tag=TAGA key=k value=a", f"topic={topic} tag=TAGC key=k value=c"]


def test_consume_rejects_a_malformed_expression_before_connecting() -> None:
    done = _txbridge("consume", "orderly", "--bootstrap", "localhost:1", "--topic", "t", "--group", "g",
                     "--subscription", "TAGA ||")  # fmt: skip
    assert done.returncode == 2
    assert "subscription expression 'TAGA ||'" in done.stderr
    assert "Traceback" not in done.stderr
