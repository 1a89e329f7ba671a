"""txbridge and Kafka's own Java console clients on one topic: same keys, same partitions.

The Java side is the real thing: Kafka 4.1.1's ConsoleProducer and ConsoleConsumer
(the ``org.apache.kafka:kafka-tools`` jar and its dependencies, fetched once into the
jar cache), run with ``java`` against the test broker.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from servers import jars
from tests.coordinator.conftest import PARTITIONS, Env, eventually
from tests.coordinator.wire_producer import Msg, WireProducer
from tests.kafka_helpers import wait_for
from tests.unit.test_partitioner import JAVA_12
from txbridge.wire import Topics, TxState

pytestmark = pytest.mark.integration

KAFKA_TOOLS = jars.JarSet(
    f"kafka-tools-{jars.kafka_version()}", (f"org.apache.kafka:kafka-tools:{jars.kafka_version()}",)
)
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
KEYS = 50
PER_TX = 5


@pytest.fixture(scope="module")
def java_tools() -> str:
    """The classpath of Kafka's console tools."""
    return str(jars.ensure_jars(KAFKA_TOOLS) / "*")


@pytest.fixture
def env(kafka_bootstrap: str, namespace_factory: Callable[..., str]) -> Iterator[Env]:
    namespace = namespace_factory(PARTITIONS, prefix="txbj")
    environment = Env(
        kafka_bootstrap, namespace, Topics(namespace), WireProducer(kafka_bootstrap, namespace, PARTITIONS)
    )
    yield environment
    for handle in environment.running:
        if handle.thread.is_alive():
            handle.stop()


def _java(classpath: str, main: str, *args: str, stdin: str = "") -> str:
    result = subprocess.run(
        ["java", "-cp", classpath, main, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{main} exited {result.returncode}:\n{result.stderr[-2000:]}"
    return result.stdout


def _headers(text: str) -> dict[str, str]:
    if text == "NO_HEADERS":
        return {}
    return dict(pair.split(":", 1) for pair in text.split(","))


def test_txbridge_puts_each_key_where_javas_producer_does_and_java_reads_its_commits(
    env: Env, topic_factory: Callable[..., str], java_tools: str
) -> None:
    topic = topic_factory(partitions=12)
    keys = [f"k{i}" for i in range(KEYS)]
    _java(
        java_tools,
        CONSOLE_PRODUCER,
        *("--bootstrap-server", env.bootstrap, "--topic", topic),
        *("--property", "parse.key=true", "--property", "key.separator=:"),
        stdin="".join(f"{key}:java-{key}\n" for key in keys),
    )
    handle = env.start()
    rolled_back = [
        env.producer.transaction(
            [Msg(topic, f"rolled-back-{key}".encode(), key=key.encode())], TxState.ROLLBACK
        )
        for key in keys[:3]
    ]
    explicit = (JAVA_12[0] + 1) % 12  # not where the key would go
    tx_of: dict[str, str] = {}
    for start in range(0, KEYS, PER_TX):
        batch = keys[start : start + PER_TX]
        messages = [
            Msg(topic, f"tx-{key}".encode(), key=key.encode(), headers=(("app", f"v-{key}".encode()),))
            for key in batch
        ]
        if start == 0:
            messages.append(Msg(topic, b"explicit", key=b"k0", partition=explicit))
        tx_id = env.producer.transaction(messages, TxState.COMMIT)
        tx_of.update(dict.fromkeys(batch, tx_id))

    seen = wait_for(env.bootstrap, topic, 2 * KEYS + 1, timeout=40)
    assert eventually(lambda: handle.service.stats["resolved_rolled_back"] >= len(rolled_back))

    # Read with a Python consumer: each key's Java and txbridge messages share a partition,
    # the one Java's partitioner computes.
    by_value = {record.value.decode(): record for record in seen if record.value is not None}
    assert len(seen) == len(by_value) == 2 * KEYS + 1
    java_partitions = {key: by_value[f"java-{key}"].partition for key in keys}
    txbridge_partitions = {key: by_value[f"tx-{key}"].partition for key in keys}
    assert java_partitions == dict(zip(keys, JAVA_12, strict=True))
    assert txbridge_partitions == java_partitions
    assert by_value["explicit"].partition == explicit
    assert by_value["tx-k7"].headers == {"app": b"v-k7", "txb.tx": tx_of["k7"].encode()}

    # Read with Java's read_committed console consumer: txbridge's commits with their headers,
    # nothing rolled back. It ends once no record came for --timeout-ms, which also has to
    # cover its group join and first fetch: 5 s was too short on a loaded box.
    output = _java(
        java_tools,
        CONSOLE_CONSUMER,
        *("--bootstrap-server", env.bootstrap, "--topic", topic, "--from-beginning"),
        *("--isolation-level", "read_committed", "--timeout-ms", "15000"),
        *("--property", "print.partition=true", "--property", "print.headers=true"),
        *("--property", "print.key=true"),
    )
    lines = output.splitlines()
    printed = {}
    for line in lines:
        partition, headers, key, value = line.split("\t")
        printed[value] = (int(partition.removeprefix("Partition:")), key, _headers(headers))
    assert len(lines) == len(printed) == 2 * KEYS + 1, output
    for key in keys:
        assert printed[f"java-{key}"] == (java_partitions[key], key, {})
        expected_headers = {"app": f"v-{key}", "txb.tx": tx_of[key]}
        assert printed[f"tx-{key}"] == (java_partitions[key], key, expected_headers)
    assert printed["explicit"] == (explicit, "k0", {"txb.tx": tx_of["k0"]})
    assert not [value for value in printed if value.startswith("rolled-back")]
