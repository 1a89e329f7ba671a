"""An mqadmin failure names its exception, so a timeout is retried whatever the stack's length.

A RocketMQ request that timed out printed its exception's line, then a stack longer than the
tail the error kept: the error said only "at org.apache.rocketmq...", and the bench's retry of a
timed-out mqadmin command (``bench.rocketmq._admin``) never saw the word. Seen in CI on a loaded
box (tests/rocketmq/test_bench_rocketmq.py). subprocess is faked here; the real mqadmin runs in
tests/rocketmq/.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import rocketmq as bench_rocketmq
from servers import rocketmq
from txbridge.errors import BrokerError

_TIMEOUT = "\n".join(
    [
        "org.apache.rocketmq.tools.admin.MQAdminException: CODE: 0 DESC: wait response on the channel "
        "<127.0.0.1:9876> timeout, 3000(ms)",
        *(f"\tat org.apache.rocketmq.remoting.Frame{n}.invoke(Frame{n}.java:{n})" for n in range(12)),
        "\t... 2 more",
    ]
)


class _Runs:
    def __init__(self, *outputs: str) -> None:
        self.outputs = list(outputs)
        self.calls = 0

    def __call__(self, command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls += 1
        return subprocess.CompletedProcess(command, 0, self.outputs.pop(0), "")


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> rocketmq.LocalRocketMQ:
    monkeypatch.setattr(rocketmq.jars, "rocketmq_classpath", lambda: "")
    return rocketmq.LocalRocketMQ(tmp_path)


def test_the_error_keeps_the_exceptions_line_and_the_stacks_tail(
    local: rocketmq.LocalRocketMQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rocketmq.subprocess, "run", _Runs(_TIMEOUT))

    with pytest.raises(BrokerError) as raised:
        local.admin("updateTopic", "-t", "t")

    message = str(raised.value)
    assert "wait response on the channel <127.0.0.1:9876> timeout" in message
    assert message.splitlines()[-1] == "\t... 2 more"


def test_a_timed_out_command_is_run_again(
    local: rocketmq.LocalRocketMQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _Runs(_TIMEOUT, "create topic to 127.0.0.1:10911 success.\n")
    monkeypatch.setattr(rocketmq.subprocess, "run", runs)
    target = bench_rocketmq._Target("127.0.0.1:8081", "127.0.0.1:9876", "DefaultCluster", local)

    out = bench_rocketmq._admin(target, "updateTopic", "-t", "t")

    assert out.startswith("create topic")
    assert runs.calls == 2
