"""What ``txbridge.acls`` grants each role, how it renders them, and what it refuses (no broker)."""

from __future__ import annotations

import shlex

import pytest

from txbridge.acls import Acl, render_commands, render_table, role_acls
from txbridge.errors import ConfigurationError


def _grants(acls: list[Acl]) -> set[tuple[str, str, bool, str]]:
    return {(a.resource, a.name, a.prefixed, a.operation) for a in acls}


def test_a_producer_writes_half_op_and_the_registry_and_reads_nothing() -> None:
    acls = role_acls("producer", "User:orders-svc", namespace="ns", topics=["orders"])

    assert _grants(acls) == {
        ("topic", "ns_half", False, "Write"),
        ("topic", "ns_op", False, "Write"),
        ("topic", "ns_producers", False, "Write"),
        ("topic", "orders", False, "Write"),
    }
    assert {a.principal for a in acls} == {"User:orders-svc"}


def test_producers_that_may_not_write_real_topics_only_see_them() -> None:
    acls = role_acls(
        "producer",
        "User:p",
        namespace="ns",
        topics=["orders", "pay-*"],
        producers_may_write_real_topics=False,
    )

    real = {g for g in _grants(acls) if not g[1].startswith("ns_")}
    assert real == {("topic", "orders", False, "Describe"), ("topic", "pay-", True, "Describe")}


def test_the_spark_sink_is_a_producer_that_also_keeps_its_decisions_topic() -> None:
    producer = role_acls("producer", "User:etl", namespace="ns", topics=["orders"])
    sink = role_acls("spark-sink", "User:etl", namespace="ns", topics=["orders"])

    assert _grants(sink) - _grants(producer) == {
        ("topic", "ns_spark_sink", False, "Create"),
        ("topic", "ns_spark_sink", False, "Read"),
        ("topic", "ns_spark_sink", False, "Write"),
        ("group", "txbridge-admin-", True, "Describe"),
        ("group", "txbridge-spark-checks-", True, "Describe"),
        ("transactional-id", "ns-spark-sink-", True, "Write"),
        ("topic", "ns_expired", False, "Read"),
        ("topic", "ns_expired", False, "Write"),
        ("topic", "ns_op", False, "Read"),
        ("topic", "ns_state", False, "Read"),
        ("transactional-id", "ns-admin-", True, "Write"),
    }
    assert _grants(producer) <= _grants(sink)
    only_seen = role_acls(
        "spark-sink", "User:etl", namespace="ns", topics=["orders"], producers_may_write_real_topics=False
    )
    assert ("topic", "orders", False, "Describe") in _grants(only_seen)
    assert ("topic", "orders", False, "Write") not in _grants(only_seen)


def test_the_coordinator_gets_its_group_transactional_ids_and_helper_groups() -> None:
    acls = role_acls("coordinator", "User:txb", namespace="ns", topics=["orders"], groups=["coord"])

    grants = _grants(acls)
    assert ("group", "coord", False, "Read") in grants
    assert ("group", "coord-offsets", False, "Describe") in grants
    assert ("transactional-id", "ns-coord-", True, "Write") in grants
    assert ("transactional-id", "ns-partition-", True, "Write") in grants  # the upgrade's fence
    assert ("transactional-id", "ns-admin-", True, "Write") in grants
    for helper in ("txbridge-registry-", "txbridge-restore-", "txbridge-halfreader-", "txbridge-admin-"):
        assert ("group", helper, True, "Describe") in grants
    topics = {(name, op) for kind, name, _, op in grants if kind == "topic"}
    assert topics == {
        ("ns_half", "Read"),
        ("ns_op", "Read"),
        ("ns_op", "Write"),
        ("ns_state", "Read"),
        ("ns_state", "Write"),
        ("ns_producers", "Read"),
        ("ns_expired", "Read"),
        ("ns_expired", "Write"),
        ("ns_quarantine", "Write"),
        ("orders", "Write"),
    }


def test_the_coordinator_group_defaults_to_txbridge_coordinator() -> None:
    acls = role_acls("coordinator", "User:txb", topics=["orders"])

    assert ("group", "txbridge-coordinator", False, "Read") in _grants(acls)
    assert ("transactional-id", "__txbridge-coord-", True, "Write") in _grants(acls)
    assert ("transactional-id", "__txbridge-partition-", True, "Write") in _grants(acls)
    assert ("topic", "__txbridge_half", False, "Read") in _grants(acls)


def test_another_namespace_defaults_to_its_own_coordinator_group() -> None:
    grants = _grants(role_acls("coordinator", "User:txb", namespace="ns", topics=["orders"]))

    assert ("group", "txbridge-coordinator.ns", False, "Read") in grants
    assert ("group", "txbridge-coordinator.ns-offsets", False, "Describe") in grants
    assert ("transactional-id", "ns-coord-", True, "Write") in grants
    # A coordinator of the default namespace may neither fence nor pose as this one's.
    default = _grants(role_acls("coordinator", "User:txb", topics=["orders"]))
    prefixes = [name for kind, name, prefixed, _ in default if kind == "transactional-id" and prefixed]
    assert not [p for p in prefixes if "ns-partition-0".startswith(p) or "ns-coord-c1-ab12".startswith(p)]


def test_a_consumer_reads_the_real_topics_and_its_group_and_no_internal_topic() -> None:
    plain = role_acls(
        "consumer", "User:c", namespace="ns", topics=["orders"], groups=["billing"], plain_consumer=True
    )
    txbridge = role_acls("consumer", "User:c", namespace="ns", topics=["orders"], groups=["billing"])

    assert _grants(plain) == {("topic", "orders", False, "Read"), ("group", "billing", False, "Read")}
    extra = _grants(txbridge) - _grants(plain)
    assert extra == {
        ("topic", "ns_dlq-billing", False, "Create"),
        ("topic", "ns_dlq-billing", False, "Write"),
        ("topic", "ns_retry-billing", False, "Create"),
        ("topic", "ns_retry-billing", False, "Read"),
        ("topic", "ns_retry-billing", False, "Write"),
    }
    internal = {"ns_half", "ns_op", "ns_state", "ns_producers", "ns_expired", "ns_quarantine"}
    assert not {name for _, name, _, _ in _grants(txbridge)} & internal


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "auditor"}, "unknown role 'auditor': one of producer, spark-sink, coordinator, consumer"),
        ({"principal": "alice"}, "principal 'alice' is not Type:name"),
        ({"topics": []}, "name the real topics"),
        ({"topics": ["orders!"]}, "is not a Kafka topic name"),
        ({"topics": ["ns_half"]}, "covers txbridge's internal topic ns_half"),
        ({"topics": ["ns*"]}, "covers txbridge's internal topic ns_half"),
        ({"groups": ["g"]}, "a producer joins no Kafka group"),
        ({"role": "consumer"}, "a consumer reads in a consumer group: pass --group"),
        ({"role": "coordinator", "producers_may_write_real_topics": False}, "an option of --role producer"),
        ({"plain_consumer": True}, "--plain-consumer is an option of --role consumer"),
        ({"role": "consumer", "groups": [" "]}, "a --group must not be empty"),
        ({"role": "spark-sink", "groups": ["g"]}, "a producer joins no Kafka group"),
        ({"topics": ["ns_spark_sink"]}, "covers txbridge's internal topic ns_spark_sink"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "role": "producer",
        "principal": "User:p",
        "namespace": "ns",
        "topics": ["orders"],
    }
    args.update(kwargs)

    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        role_acls(**args)  # type: ignore[arg-type]


def test_the_table_has_one_line_per_resource_with_its_operations_and_why() -> None:
    acls = role_acls("coordinator", "User:txb", namespace="ns", topics=["orders"], groups=["coord"])

    lines = render_table(acls).splitlines()

    assert lines[0].split() == ["resource", "pattern", "name", "operations", "why"]
    state = next(line for line in lines if " ns_state " in line)
    assert state.split()[:4] == ["topic", "literal", "ns_state", "Read,Write"]
    assert "changelog of pending transactions" in state
    txn = next(line for line in lines if line.startswith("transactional-id") and "ns-coord-*" in line)
    assert txn.split()[:4] == ["transactional-id", "prefixed", "ns-coord-*", "Write"]
    assert len(lines) == 1 + len({(a.resource, a.name, a.prefixed) for a in acls})


def test_the_commands_are_kafka_acls_lines_that_grant_the_same() -> None:
    acls = role_acls("coordinator", "User:CN=txb,O=acme", namespace="ns", topics=["orders"], groups=["coord"])

    lines = render_commands(acls, "b1:9092", "/etc/admin properties").splitlines()
    parsed = [shlex.split(line) for line in lines]

    granted = set()
    for argv in parsed:
        assert argv[:6] == ["kafka-acls.sh", "--bootstrap-server", "b1:9092", "--command-config",
                            "/etc/admin properties", "--add"]  # fmt: skip
        assert argv[6:8] == ["--allow-principal", "User:CN=txb,O=acme"]
        ops = [argv[i + 1] for i, a in enumerate(argv) if a == "--operation"]
        kind = next(a[2:] for a in argv if a in ("--topic", "--group", "--transactional-id"))
        name = argv[argv.index(f"--{kind}") + 1]
        prefixed = argv[-2:] == ["--resource-pattern-type", "prefixed"]
        granted |= {(kind, name, prefixed, op) for op in ops}
    assert granted == _grants(acls)


def test_commands_without_a_bootstrap_name_a_variable() -> None:
    acls = role_acls("producer", "User:p", namespace="ns", topics=["orders"])

    first = render_commands(acls).splitlines()[0]

    assert first.startswith("kafka-acls.sh --bootstrap-server $BOOTSTRAP --add --allow-principal User:p ")


# ------------------------------------------------------------------ the command


def test_the_command_prints_the_table_and_the_kafka_acls_lines_without_contacting_kafka() -> None:
    from click.testing import CliRunner

    from cli.main import main

    result = CliRunner().invoke(
        main,
        ["acls", "--role", "consumer", "--principal", "User:billing", "--namespace", "ns",
         "--topic", "orders", "--group", "billing", "--plain-consumer", "--bootstrap", "nowhere:1"],
    )  # fmt: skip

    kafka_acls = "kafka-acls.sh --bootstrap-server nowhere:1 --add --allow-principal User:billing"
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "# ACLs of the consumer role for User:billing (namespace ns)",
        "resource  pattern  name     operations  why",
        "topic     literal  orders   Read        reads committed messages",
        "group     literal  billing  Read        its consumer group",
        "",
        "# the same with Kafka's CLI:",
        f"{kafka_acls} --operation Read --topic orders",
        f"{kafka_acls} --operation Read --group billing",
    ]


def test_the_command_reports_bad_input_in_one_line() -> None:
    from click.testing import CliRunner

    from cli.main import main

    result = CliRunner().invoke(main, ["acls", "--role", "consumer", "--principal", "User:b", "--topic", "t"])

    assert result.exit_code == 2
    assert result.output == "error: a consumer reads in a consumer group: pass --group NAME (repeatable)\n"
