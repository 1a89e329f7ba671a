"""The local RocketMQ answers a real client: transactional messages committed, rolled back, checked.

What a SimpleConsumer receives is the assertion: the committed message and the one the
broker back-checked (the checker answers COMMIT) arrive, the rolled back one never does.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

from cli.main import main
from servers.broker import free_port
from servers.processes import pid_alive
from servers.rocketmq import TRANSACTION_SETTINGS, LocalRocketMQ, free_broker_port
from tests.rocketmq.conftest import SessionRocketMQ
from txbridge.errors import BrokerError

pytestmark = pytest.mark.rocketmq


class _CommitChecker(TransactionChecker):
    def __init__(self) -> None:
        self.checked: list[bytes] = []

    def check(self, message: Message) -> TransactionResolution:
        self.checked.append(bytes(message.body))
        return TransactionResolution.COMMIT


def _message(topic: str, body: bytes) -> Message:
    message = Message()
    message.topic = topic
    message.body = body
    return message


def _receive(consumer: SimpleConsumer, want: set[bytes], timeout: float) -> list[bytes]:
    """Bodies received (and acked) until ``want`` all arrived or ``timeout``; errors are retried."""
    received: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not want <= set(received):
        try:
            messages = consumer.receive(16, 30)
        except Exception:  # the proxy answers a fresh consumer's first receive with an error
            time.sleep(1.0)
            continue
        for message in messages:
            received.append(bytes(message.body))
            consumer.ack(message)
    return received


def test_transactional_messages_committed_rolled_back_and_checked(session: SessionRocketMQ) -> None:
    local_rocketmq = session.rocketmq
    topic = f"tx-{uuid.uuid4().hex[:10]}"
    group = f"g-{uuid.uuid4().hex[:10]}"
    local_rocketmq.create_topic(topic, transactional=True)
    local_rocketmq.create_group(group)
    config = ClientConfiguration(local_rocketmq.endpoint, Credentials(), request_timeout=10)
    checker = _CommitChecker()
    producer = Producer(config, (topic,), checker)
    producer.startup()
    try:
        committed = producer.begin_transaction()
        producer.send(_message(topic, b"committed"), committed)
        committed.commit()
        rolled_back = producer.begin_transaction()
        producer.send(_message(topic, b"rolled-back"), rolled_back)
        rolled_back.rollback()
        undecided = producer.begin_transaction()
        producer.send(_message(topic, b"undecided"), undecided)  # neither commit nor rollback

        consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
        consumer.startup()
        try:
            received = _receive(consumer, {b"committed", b"undecided"}, timeout=60)
            # The rolled back message would come with the others; wait one more check round for it.
            time.sleep(TRANSACTION_SETTINGS["transactionTimeOut"] / 1000)
            received += _receive(consumer, {b"never"}, timeout=6)
        finally:
            consumer.shutdown()
    finally:
        producer.shutdown()
    assert b"committed" in received
    assert b"undecided" in received
    assert b"rolled-back" not in received
    assert b"undecided" in checker.checked
    assert b"rolled-back" not in checker.checked
    # transactionOpBatchInterval well below transactionTimeOut: a decided transaction is never checked.
    assert b"committed" not in checker.checked


def test_taken_port_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        rocketmq = LocalRocketMQ(
            tmp_path,
            namesrv_port=free_port(),
            grpc_port=taken,
            remoting_port=free_port(),
            broker_port=free_broker_port(),
        )
        with pytest.raises(BrokerError, match=rf"grpc port {taken} on 127.0.0.1 is taken.*--grpc-port"):
            rocketmq.start(timeout=30)
        result = CliRunner().invoke(
            main, ["rocketmq", "start", "--namesrv-port", str(taken)], env={"TXBRIDGE_CACHE": str(tmp_path)}
        )
    assert result.exit_code == 2
    assert result.output.startswith(f"error: RocketMQ's namesrv port {taken} on 127.0.0.1 is taken")
    assert "--namesrv-port" in result.output
    assert "Traceback" not in result.output
    assert not rocketmq.status().namesrv_pid
    assert not list(tmp_path.glob("**/*.pid"))


def test_a_process_that_dies_in_start_up_is_an_error_naming_the_cause(tmp_path: Path) -> None:
    rocketmq = LocalRocketMQ.on_free_ports(tmp_path)
    rocketmq.namesrv_heap = "12m"  # below the JVM's initial heap: it refuses to start
    with pytest.raises(BrokerError) as caught:
        rocketmq.start(timeout=60)
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith("the RocketMQ namesrv exited with code 1 during start-up: ")
    assert "Initial heap size set to a larger value than the maximum heap size" in first_line
    assert f"logs in {tmp_path / 'logs'}" in first_line
    assert not rocketmq.status().namesrv_pid
    assert not list(tmp_path.glob("*.pid"))


def test_cli_status_then_stop_leaves_no_process(session: SessionRocketMQ) -> None:
    # Last in this module: it stops the session's instance (the fixture's stop is then a no-op).
    runner = CliRunner()
    env = {"TXBRIDGE_CACHE": str(session.cache)}
    status = session.rocketmq.status()
    assert status.namesrv_pid is not None
    assert status.proxy_pid is not None
    shown = runner.invoke(main, ["rocketmq", "status"], env=env)
    assert shown.exit_code == 0, shown.output
    assert f"proxy: running at {status.endpoint} (pid {status.proxy_pid}, RSS " in shown.output
    assert f"name server: running at {status.namesrv_addr} (pid {status.namesrv_pid}, RSS " in shown.output

    stopped = runner.invoke(main, ["rocketmq", "stop"], env=env)
    assert stopped.output == "stopped\n"
    assert not pid_alive(status.namesrv_pid)
    assert not pid_alive(status.proxy_pid)
    after = runner.invoke(main, ["rocketmq", "status"], env=env)
    assert after.exit_code == 1
    assert "not running" in after.output
    assert runner.invoke(main, ["rocketmq", "stop"], env=env).output == "no local RocketMQ was running\n"
