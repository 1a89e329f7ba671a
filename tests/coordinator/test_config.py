"""Configuration: sources, precedence, fail-fast messages, hidden secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group import membership
from txbridge import kafka
from txbridge.errors import ConfigurationError
from txbridge.wire import default_coordinator_group

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_compose_file_loads() -> None:
    config = CoordinatorConfig.load(toml_path=ROOT / "compose" / "coordinator.toml")
    assert config.bootstrap == "kafka:9092"
    assert config.allowed_check_hosts == ("127.0.0.1", "localhost", "orders-service")
    assert config.metrics_port == 9464
    assert config.extra_config == {"session.timeout.ms": 10000}


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('bootstrap = "file:1"\nmax_checks = 3\ncheck_delay_s = 2.0\n')
    env = {"TXBRIDGE_MAX_CHECKS": "7", "TXBRIDGE_CHECK_DELAY_S": "4.5"}
    config = CoordinatorConfig.load(flags={"check_delay_s": 9.0, "namespace": None}, env=env, toml_path=path)
    assert (config.bootstrap, config.max_checks, config.check_delay_s) == ("file:1", 7, 9.0)
    assert config.namespace == "__txbridge"


def test_secrets_come_from_env_and_never_show_in_repr() -> None:
    env = {"TXBRIDGE_SECRETS": "orders=s3cr3t-a,payments=s3cr3t-b", "TXBRIDGE_DEFAULT_SECRET": "fallback-x"}
    config = CoordinatorConfig.load(flags={"bootstrap": "b:1"}, env=env)
    assert config.secrets.for_group("orders") == b"s3cr3t-a"
    assert config.secrets.for_group("other") == b"fallback-x"
    config = config.replace(extra_config={"sasl.password": "kafka-pw-9"})
    text = repr(config)
    assert "kafka-pw-9" not in text
    assert "s3cr3t" not in text
    assert "fallback-x" not in text
    assert "orders" in text


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"max_checks": "many"}, "max_checks"),
        ({"max_checks": 0}, "max_checks"),
        ({"check_timeout_s": -1}, "check_timeout_s"),
        ({"commit_interval_ms": 7000}, "commit_interval_ms"),  # above a tenth of transaction_timeout_ms
        ({"allowed_check_hosts": ""}, "allowed_check_hosts"),
        ({"max_chekcs": 3}, "max_chekcs"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"group_protocol": "cooperative"}, "group_protocol"),
    ],
)
def test_bad_values_fail_fast_naming_the_setting(raw: dict, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        CoordinatorConfig.from_mapping({"bootstrap": "b:1", **raw})


def test_unreadable_file_says_which(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("max_checks = = 3")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        CoordinatorConfig.load(toml_path=bad)
    with pytest.raises(ConfigurationError, match="does not exist"):
        CoordinatorConfig.load(toml_path=tmp_path / "missing.toml")


def test_only_allowed_hosts_pass() -> None:
    config = CoordinatorConfig(bootstrap="b:1")
    assert config.host_allowed("http://127.0.0.1:8431/txbridge/check")
    assert config.host_allowed("https://localhost/check")
    assert not config.host_allowed("http://169.254.169.254/latest")
    assert not config.host_allowed("file:///etc/passwd")
    assert not config.host_allowed("http://127.0.0.1.evil.example/")


def test_the_group_defaults_to_the_namespaces_own(tmp_path: Path) -> None:
    assert CoordinatorConfig(bootstrap="b:1").group_id == "txbridge-coordinator"
    assert CoordinatorConfig(bootstrap="b:1", namespace="ns1").group_id == "txbridge-coordinator.ns1"
    assert CoordinatorConfig(bootstrap="b:1", namespace="ns1", group_id="").group_id == (
        default_coordinator_group("ns1")
    )
    path = tmp_path / "c.toml"
    path.write_text('[coordinator]\nbootstrap = "b:1"\nnamespace = "ns2"\n')
    assert CoordinatorConfig.load(toml_path=path).group_id == "txbridge-coordinator.ns2"
    env = {"TXBRIDGE_NAMESPACE": "ns3"}
    assert CoordinatorConfig.load(flags={"group_id": None}, env=env, toml_path=path).group_id == (
        "txbridge-coordinator.ns3"
    )


def test_a_given_group_is_kept_whatever_the_namespace() -> None:
    config = CoordinatorConfig.from_mapping({"bootstrap": "b:1", "namespace": "ns1", "group_id": "mine"})
    assert config.group_id == "mine"
    assert config.partition_transactional_id(4) == "ns1-partition-4"


def test_the_group_protocol_comes_from_flags_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('bootstrap = "b:1"\ngroup_protocol = "consumer"\n')
    assert CoordinatorConfig.load(toml_path=path).group_protocol == "consumer"
    env = {"TXBRIDGE_GROUP_PROTOCOL": "consumer"}
    assert CoordinatorConfig.load(flags={"bootstrap": "b:1"}, env=env).group_protocol == "consumer"
    flags = {"bootstrap": "b:1", "group_protocol": "classic"}
    assert CoordinatorConfig.load(flags=flags, env=env).group_protocol == "classic"
    assert CoordinatorConfig(bootstrap="b:1").group_protocol == "classic"


@pytest.mark.integration
def test_the_consumer_protocol_is_checked_against_the_brokers(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local broker (Kafka 4.x) accepts it; brokers that do not make the start fail, saying
    what to change."""
    config = CoordinatorConfig(bootstrap=kafka_bootstrap, group_protocol="consumer")
    assert "consumer" in (kafka.group_protocols(kafka_bootstrap) or set())
    membership.require_consumer_protocol(config)
    monkeypatch.setattr(kafka, "group_protocols", lambda *_a, **_k: {"classic"})
    with pytest.raises(ConfigurationError, match="group_protocol = classic"):
        membership.require_consumer_protocol(config)
