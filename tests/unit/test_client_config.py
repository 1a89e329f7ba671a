"""One client configuration for every part: the properties file, -X, and the two clients' names.

Pure: librdkafka checks the settings with a throwaway client that never connects; the
TLS files are issued in a temp folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servers.certs import ensure_cluster_tls
from txbridge.client_config import (
    PLAIN_LOGIN,
    SCRAM_LOGIN,
    ClientConfig,
    is_secret,
    parse_properties,
)
from txbridge.errors import ConfigurationError

PASSWORD = "s3cr3t-Pa55"  # noqa: S105 - a test value that must never be shown


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA file, a certificate chain, its key, and one PEM file holding both (a PEM keystore)."""
    folder = tmp_path_factory.mktemp("tls")
    issued = ensure_cluster_tls(folder, [1])
    node = issued.nodes[1]
    both = folder / "client.pem"
    both.write_bytes(node.key.read_bytes() + node.chain.read_bytes())
    return {"ca": issued.ca, "chain": node.chain, "key": node.key, "both": both}


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def _java_file(tmp_path: Path, ca: Path, user: str = "admin") -> Path:
    return _file(
        tmp_path,
        "# as 'txbridge kafka start --brokers 3 --secure' writes it\n"
        "bootstrap.servers=127.0.0.1:1,127.0.0.1:2\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        f'sasl.jaas.config={SCRAM_LOGIN} required username="{user}" password="{PASSWORD}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca}\n",
    )


# ------------------------------------------------------------------ the properties format


def test_the_properties_format_as_java_reads_it() -> None:
    text = (
        "# a comment\n"
        "   ! another, indented\n"
        "\n"
        "a=1\n"
        "b: 2\n"
        "c 3\n"
        "  d  =  spaced out  \n"
        "e=first \\\n"
        "    second\n"
        "pem=-----BEGIN-----\\nAAA\\n-----END-----\n"
        "unicode=\\u00e9t\\u00e9\n"
        "path\\ with\\ spaces=C\\:\\\\dir\n"
        "empty=\n"
    )

    assert parse_properties(text) == [
        ("a", "1", 4),
        ("b", "2", 5),
        ("c", "3", 6),
        ("d", "spaced out  ", 7),
        ("e", "first second", 8),
        ("pem", "-----BEGIN-----\nAAA\n-----END-----", 10),
        ("unicode", "été", 11),
        ("path with spaces", "C:\\dir", 12),
        ("empty", "", 13),
    ]


def test_an_escaped_backslash_at_the_end_does_not_continue_the_line() -> None:
    assert parse_properties("a=x\\\\\nb=y\n") == [("a", "x\\", 1), ("b", "y", 2)]


# ------------------------------------------------------------------ Java names -> librdkafka


def test_the_secured_clusters_java_file_gives_librdkafka_settings(
    tmp_path: Path, tls: dict[str, Path]
) -> None:
    config = ClientConfig.load(_java_file(tmp_path, tls["ca"]))

    assert config.bootstrap == "127.0.0.1:1,127.0.0.1:2"
    assert config.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(tls["ca"]),
    }


def test_librdkafka_names_give_the_java_clients(tls: dict[str, Path]) -> None:
    config = ClientConfig.from_mapping(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": "orders",
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(tls["ca"]),
            "client.id": "orders-svc",
            "fetch.wait.max.ms": 50,
        }
    )

    assert config.java() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": f'{SCRAM_LOGIN} required username="orders" password="{PASSWORD}";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls["ca"]),
        "client.id": "orders-svc",
        "fetch.max.wait.ms": "50",
    }
    assert config.spark_options()["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert all(name.startswith("kafka.") for name in config.spark_options())


def test_plain_gets_the_plain_login_module_and_quotes_are_escaped() -> None:
    config = ClientConfig.from_mapping(
        {"sasl.mechanism": "PLAIN", "sasl.username": 'a"b', "sasl.password": "c\\d"}
    )

    jaas = config.java()["sasl.jaas.config"]

    assert jaas == f'{PLAIN_LOGIN} required username="a\\"b" password="c\\\\d";'
    back = ClientConfig.from_mapping({"sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas}).librdkafka()
    assert (back["sasl.username"], back["sasl.password"]) == ('a"b', "c\\d")


def test_java_and_back_gives_the_same_librdkafka_settings(tmp_path: Path, tls: dict[str, Path]) -> None:
    original = ClientConfig.load(_java_file(tmp_path, tls["ca"]))

    again = ClientConfig.from_mapping(original.java())

    assert again.librdkafka() == original.librdkafka()


@pytest.mark.parametrize(
    ("java", "librdkafka"),
    [
        ({"ssl.endpoint.identification.algorithm": ""}, {"ssl.endpoint.identification.algorithm": "none"}),
        (
            {"ssl.endpoint.identification.algorithm": "https"},
            {"ssl.endpoint.identification.algorithm": "https"},
        ),
        ({"send.buffer.bytes": "131072"}, {"socket.send.buffer.bytes": "131072"}),
        ({"request.timeout.ms": "20000"}, {"request.timeout.ms": "20000"}),
    ],
)
def test_same_meaning_under_each_clients_name(java: dict[str, str], librdkafka: dict[str, str]) -> None:
    assert ClientConfig.from_mapping(java).librdkafka() == librdkafka
    assert ClientConfig.from_mapping(librdkafka).java() == java


def test_a_pem_keystore_file_is_the_certificate_and_the_key(tls: dict[str, Path]) -> None:
    java = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(tls["both"]), "ssl.key.password": "kp"}

    librdkafka = ClientConfig.from_mapping(java).librdkafka()

    assert librdkafka == {
        "ssl.certificate.location": str(tls["both"]),
        "ssl.key.location": str(tls["both"]),
        "ssl.key.password": "kp",
    }
    assert ClientConfig.from_mapping(librdkafka).java() == java


def test_a_certificate_and_a_key_in_two_files_cannot_be_a_java_keystore(tls: dict[str, Path]) -> None:
    config = ClientConfig.from_mapping(
        {"ssl.certificate.location": str(tls["chain"]), "ssl.key.location": str(tls["key"])}
    )

    assert set(config.librdkafka()) == {"ssl.certificate.location", "ssl.key.location"}
    with pytest.raises(
        ConfigurationError, match=r"ssl.certificate.location \(client_config\).* one PEM file"
    ):
        config.java()


def test_inline_pem_certificates_both_ways(tls: dict[str, Path]) -> None:
    ca, key, chain = (tls[n].read_text() for n in ("ca", "key", "chain"))
    java = {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": ca,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": key,
        "ssl.keystore.certificate.chain": chain,
    }

    librdkafka = ClientConfig.from_mapping(java).librdkafka()

    assert librdkafka == {"ssl.ca.pem": ca, "ssl.key.pem": key, "ssl.certificate.pem": chain}
    assert ClientConfig.from_mapping(librdkafka).java() == java


def test_a_pkcs12_keystore_keeps_its_names() -> None:
    java = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/k.p12", "ssl.keystore.password": "x"}

    config = ClientConfig.from_mapping(java)

    assert (
        ClientConfig.from_mapping({k: v for k, v in java.items() if k != "ssl.keystore.type"}).java() == java
    )
    assert config.java() == java


# ------------------------------------------------------------------ precedence


def test_overrides_win_over_the_file_even_under_the_other_name(tmp_path: Path, tls: dict[str, Path]) -> None:
    path = _java_file(tmp_path, tls["ca"])

    config = ClientConfig.load(path, ["sasl.password=other", "sasl.mechanisms=SCRAM-SHA-256", "client.id=x"])

    settings = config.librdkafka()
    assert (settings["sasl.username"], settings["sasl.password"]) == ("admin", "other")
    assert settings["sasl.mechanisms"] == "SCRAM-SHA-256"
    assert settings["client.id"] == "x"


def test_the_truststore_type_in_the_file_applies_to_a_location_given_with_x(
    tmp_path: Path, tls: dict[str, Path]
) -> None:
    path = _file(tmp_path, "ssl.truststore.type=PEM\n")

    config = ClientConfig.load(path, [f"ssl.truststore.location={tls['ca']}"])

    assert config.librdkafka() == {"ssl.ca.location": str(tls["ca"])}


def test_merged_settings_win_and_the_file_is_kept(tmp_path: Path, tls: dict[str, Path]) -> None:
    base = ClientConfig.load(_java_file(tmp_path, tls["ca"]))

    merged = base.merged(ClientConfig.from_mapping({"client.id": "toml"}, "[kafka] of c.toml"))

    assert merged.librdkafka()["client.id"] == "toml"
    assert merged.file == base.file
    assert merged.bootstrap == base.bootstrap


def test_cli_args_give_a_child_process_the_same_settings(tmp_path: Path, tls: dict[str, Path]) -> None:
    config = ClientConfig.load(_java_file(tmp_path, tls["ca"]), ["client.id=x"])

    args = config.cli_args()

    assert args == ["--command-config", str(config.file), "-X", "client.id=x"]
    again = ClientConfig.load(args[1], args[3::2])
    assert again.librdkafka() == config.librdkafka()


def test_coerce_takes_a_config_a_dict_or_none() -> None:
    config = ClientConfig.from_mapping({"client.id": "a"})

    assert ClientConfig.coerce(config) is config
    assert ClientConfig.coerce({"client.id": "a"}).librdkafka() == {"client.id": "a"}
    assert ClientConfig.coerce(None).librdkafka() == {}
    assert not ClientConfig.coerce(None)
    with pytest.raises(ConfigurationError, match="must be a ClientConfig or a dict of settings, not list"):
        ClientConfig.coerce(["client.id=a"])  # type: ignore[arg-type]


def test_a_spawned_process_gets_the_same_settings(tmp_path: Path, tls: dict[str, Path]) -> None:
    import pickle

    config = ClientConfig.load(_java_file(tmp_path, tls["ca"]), ["client.id=x"])

    again = pickle.loads(pickle.dumps(config))  # noqa: S301 - our own object

    assert again == config
    assert again.librdkafka() == config.librdkafka()
    assert again.file == config.file


def test_it_cannot_be_changed() -> None:
    config = ClientConfig.from_mapping({"client.id": "a"})

    with pytest.raises(AttributeError, match="immutable"):
        config.file = None


# ------------------------------------------------------------------ what is refused, and how it is said


def test_a_misspelt_setting_names_itself_its_file_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "security.protocol=SASL_SSL\nsasl.usernme=admin\n")

    with pytest.raises(ConfigurationError) as refused:
        ClientConfig.load(path)

    assert str(refused.value) == (
        f"unknown client setting sasl.usernme ({path} line 2): neither librdkafka nor the Java client "
        "has it (did you mean sasl.username?)"
    )


def test_a_misspelt_override_is_named_as_one() -> None:
    with pytest.raises(ConfigurationError, match=r"^unknown client setting ssl\.ca\.locaton \(-X\)"):
        ClientConfig.load(None, ["ssl.ca.locaton=/ca.pem"])


def test_a_java_truststore_is_refused_for_librdkafka_and_kept_for_java() -> None:
    config = ClientConfig.load(
        None, ["ssl.truststore.location=/t.jks", f"ssl.truststore.password={PASSWORD}"]
    )

    with pytest.raises(ConfigurationError) as refused:
        config.librdkafka()

    message = str(refused.value)
    assert message.startswith("client setting ssl.truststore.location (-X): librdkafka reads a PEM CA file")
    assert PASSWORD not in message
    assert config.java() == {"ssl.truststore.location": "/t.jks", "ssl.truststore.password": PASSWORD}


def test_a_java_only_setting_is_refused_for_librdkafka(tmp_path: Path) -> None:
    path = _file(tmp_path, "ssl.enabled.protocols=TLSv1.3\n")

    config = ClientConfig.load(path)

    assert config.java() == {"ssl.enabled.protocols": "TLSv1.3"}
    with pytest.raises(
        ConfigurationError, match=rf"^client setting ssl.enabled.protocols \({path} line 1\) is a Java"
    ):
        config.librdkafka()


def test_a_librdkafka_only_setting_is_refused_for_java() -> None:
    config = ClientConfig.load(None, ["enable.ssl.certificate.verification=false"])

    assert config.librdkafka() == {"enable.ssl.certificate.verification": "false"}
    with pytest.raises(ConfigurationError) as refused:
        config.java()
    assert str(refused.value) == (
        "client setting enable.ssl.certificate.verification (-X) is a librdkafka setting the Java client "
        "(Spark's Kafka source) does not have: remove it, or use the Java client's setting"
    )


def test_a_login_module_librdkafka_cannot_take_is_refused_for_it() -> None:
    jaas = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    config = ClientConfig.from_mapping({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": jaas})

    assert config.java()["sasl.jaas.config"] == jaas
    with pytest.raises(
        ConfigurationError, match=r"^client setting sasl.jaas.config \(client_config\): librdkafka"
    ):
        config.librdkafka()


def test_an_unreadable_jaas_entry_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError) as refused:
        ClientConfig.from_mapping({"sasl.jaas.config": f'{SCRAM_LOGIN} required password="{PASSWORD}"'})

    assert "sasl.jaas.config (client_config) is not a JAAS entry" in str(refused.value)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("name", ["group.id", "transactional.id", "isolation.level", "enable.idempotence"])
def test_a_setting_txbridge_sets_per_client_is_refused(name: str) -> None:
    with pytest.raises(
        ConfigurationError, match=rf"^client setting {name} \(-X\) is set by txbridge for each client"
    ):
        ClientConfig.load(None, [f"{name}=x"])


def test_a_value_librdkafka_refuses_is_named() -> None:
    config = ClientConfig.load(None, ["security.protocol=SASL_SSLL"])

    with pytest.raises(ConfigurationError) as refused:
        config.librdkafka()

    assert str(refused.value) == (
        "client setting security.protocol (-X): librdkafka does not accept the value 'SASL_SSLL'"
    )


def test_sasl_without_a_mechanism_says_what_is_missing() -> None:
    with pytest.raises(ConfigurationError) as refused:
        ClientConfig.load(None, ["security.protocol=SASL_SSL"]).librdkafka()

    assert str(refused.value) == (
        "client setting security.protocol (-X) needs sasl.mechanism too (e.g. SCRAM-SHA-512) and the "
        "user's credentials (sasl.jaas.config, or sasl.username and sasl.password)"
    )


def test_settings_librdkafka_refuses_together_never_show_the_password() -> None:
    config = ClientConfig.load(
        None, ["security.protocol=SASL_SSL", "sasl.mechanisms=SCRAM-SHA-512", f"sasl.password={PASSWORD}"]
    )

    with pytest.raises(ConfigurationError) as refused:
        config.librdkafka()
    with pytest.raises(ConfigurationError) as java_refused:
        config.java()

    assert str(refused.value) == (
        "librdkafka refuses the client settings of -X: sasl.username and sasl.password must be set"
    )
    assert "needs sasl.username too" in str(java_refused.value)
    assert PASSWORD not in str(java_refused.value)


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    path = _file(tmp_path, f"ssl.truststore.type=PEM\nssl.truststore.location={tmp_path / 'ca.pem'}\n")

    with pytest.raises(ConfigurationError) as refused:
        ClientConfig.load(path).librdkafka()

    assert (
        str(refused.value)
        == f"client setting ssl.truststore.location ({path} line 2): {tmp_path / 'ca.pem'} does not exist"
    )


def test_a_missing_file_and_a_pair_without_equals_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"client properties file .*nope.properties does not exist"):
        ClientConfig.load(tmp_path / "nope.properties")
    with pytest.raises(ConfigurationError) as refused:
        ClientConfig.load(None, [f"sasl.password{PASSWORD}"])
    assert str(refused.value) == "-X expects KEY=VALUE, got '***'"


def test_an_empty_bootstrap_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"bootstrap.servers is empty \(-X\)"):
        ClientConfig.load(None, ["bootstrap.servers="])


def test_a_callback_goes_to_librdkafka_only() -> None:
    errors: list[object] = []
    config = ClientConfig.from_mapping({"error_cb": errors.append})

    assert config.librdkafka() == {"error_cb": errors.append}
    with pytest.raises(ConfigurationError, match=r"error_cb \(client_config\) is a"):
        config.java()


# ------------------------------------------------------------------ secrets are never shown


@pytest.mark.parametrize(
    "name",
    [
        "sasl.password",
        "sasl.jaas.config",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "ssl.key.pem",
        "ssl.keystore.key",
        "sasl.oauthbearer.client.secret",
    ],
)
def test_secrets_are_masked_in_repr(name: str) -> None:
    value = (
        f'{SCRAM_LOGIN} required username="u" password="{PASSWORD}";'
        if name == "sasl.jaas.config"
        else PASSWORD
    )

    config = ClientConfig.from_mapping({name: value})

    assert is_secret(name)
    assert repr(config) == f"ClientConfig(settings={{'{name}': '***'}})"
    assert PASSWORD not in repr(config.settings)


def test_repr_shows_the_settings_but_no_secret(tmp_path: Path, tls: dict[str, Path]) -> None:
    config = ClientConfig.load(
        _java_file(tmp_path, tls["ca"]),
        [f"ssl.key.password={PASSWORD}", f"ssl.keystore.password={PASSWORD}", f"ssl.key.pem={PASSWORD}"],
    )

    shown = repr(config)

    assert PASSWORD not in shown
    assert "'sasl.jaas.config': '***'" in shown
    assert "'ssl.key.password': '***'" in shown
    assert "'ssl.key.pem': '***'" in shown
    assert "'security.protocol': 'SASL_SSL'" in shown
    assert PASSWORD not in repr(config.settings)
    assert config.scrub(f"x {PASSWORD} y") == "x *** y"


def test_non_secrets_are_not_taken_for_secrets() -> None:
    assert not any(
        is_secret(n) for n in ("sasl.username", "ssl.ca.location", "sasl.oauthbearer.token.endpoint.url")
    )


# ------------------------------------------------------------------ the coordinator's TOML and flags


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return path


def test_the_coordinators_toml_names_the_file_and_a_kafka_table_on_top(
    tmp_path: Path, tls: dict[str, Path]
) -> None:
    from coordinator.config import CoordinatorConfig

    _java_file(tmp_path, tls["ca"])
    toml = _toml(
        tmp_path,
        'client_config = "client.properties"\n'  # relative to the TOML file
        '[kafka]\n"client.id" = "coord"\n"request.timeout.ms" = 20000\n'
        '[extra_config]\n"session.timeout.ms" = 7000\n',
    )

    config = CoordinatorConfig.load(toml_path=toml, flags={"client_overrides": ("client.id=cli",)})

    assert config.extra_config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(tls["ca"]),
        "client.id": "cli",
        "request.timeout.ms": 20000,
        "session.timeout.ms": 7000,
    }
    assert config.client_config.bootstrap == "127.0.0.1:1,127.0.0.1:2"
    assert PASSWORD not in repr(config)


def test_command_config_and_its_variable_replace_the_tomls_file(tmp_path: Path, tls: dict[str, Path]) -> None:
    from coordinator.config import CoordinatorConfig

    flag_file = _java_file(tmp_path, tls["ca"], user="from-flag")
    toml = _toml(
        tmp_path, '[coordinator]\nclient_config = "/nowhere.properties"\n[kafka]\n"client.id" = "c"\n'
    )

    by_flag = CoordinatorConfig.load(toml_path=toml, flags={"command_config": str(flag_file)})
    by_env = CoordinatorConfig.load(toml_path=toml, env={"TXBRIDGE_COMMAND_CONFIG": str(flag_file)})

    for config in (by_flag, by_env):
        assert config.extra_config["sasl.username"] == "from-flag"
        assert config.extra_config["client.id"] == "c"  # [kafka] beside [coordinator] still applies


def test_the_coordinators_bad_client_setting_names_the_toml_table(tmp_path: Path) -> None:
    from coordinator.config import CoordinatorConfig

    toml = _toml(tmp_path, '[kafka]\n"sasl.usernam" = "x"\n')

    with pytest.raises(
        ConfigurationError, match=rf"^unknown client setting sasl.usernam \(\[kafka\] of {toml}\)"
    ):
        CoordinatorConfig.load(toml_path=toml)


# ------------------------------------------------------------------ the SDK's argument


def test_the_producer_takes_the_settings_and_never_shows_the_password(
    tmp_path: Path, tls: dict[str, Path]
) -> None:
    from txbridge import TransactionProducer

    producer = TransactionProducer(
        "127.0.0.1:1",
        "orders-svc",
        secret="s",  # noqa: S106 - a test-only HMAC secret
        check=lambda _txn: None,
        client_config=ClientConfig.load(_java_file(tmp_path, tls["ca"])),
        extra_config={"linger.ms": 1},
    )

    assert producer.settings.extra_config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(tls["ca"]),
        "linger.ms": 1,
    }
    assert PASSWORD not in repr(producer.settings)


def test_a_consumer_refuses_a_misspelt_setting_in_its_constructor() -> None:
    from txbridge.consumer import OrderlyConsumer

    with pytest.raises(ConfigurationError, match=r"^unknown client setting sasl.pasword \(client_config\)"):
        OrderlyConsumer("127.0.0.1:1", "g", "t", lambda _m, _c: None, client_config={"sasl.pasword": "x"})
