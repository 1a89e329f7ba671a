"""The librdkafka settings txbridge's clients start from (pure: no broker)."""

from __future__ import annotations

from txbridge import kafka


def test_a_transactional_producer_retries_concurrent_transactions_quickly() -> None:
    config = kafka.producer_config("h:9092", transactional_id="t")
    assert config["retry.backoff.ms"] == kafka.TRANSACTIONAL_RETRY_BACKOFF_MS == 10
    assert config["transactional.id"] == "t"
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")


def test_a_plain_producer_keeps_librdkafkas_retry_backoff() -> None:
    assert "retry.backoff.ms" not in kafka.producer_config("h:9092")


def test_the_users_settings_win() -> None:
    config = kafka.producer_config("h:9092", {"retry.backoff.ms": 250}, transactional_id="t")
    assert config["retry.backoff.ms"] == 250


_MIXED = {
    "security.protocol": "PLAINTEXT",
    "sasl.username": "u",
    "client.id": "c",
    "linger.ms": 20,
    "queue.buffering.max.kbytes": 1024,
    "acks": "all",
    "group.instance.id": "g-1",
    "session.timeout.ms": 45_000,
    "isolation.level": "read_uncommitted",
    "fetch.wait.max.ms": 10,
    "on_delivery": print,
    "on_commit": print,
}
_COMMON = {"security.protocol", "sasl.username", "client.id"}
_PRODUCING = {"linger.ms", "queue.buffering.max.kbytes", "acks", "on_delivery"}
_CONSUMING = {"group.instance.id", "session.timeout.ms", "isolation.level", "fetch.wait.max.ms", "on_commit"}


def test_each_client_role_takes_the_common_settings_and_its_own() -> None:
    assert set(kafka.settings_for("producer", _MIXED)) == _COMMON | _PRODUCING
    assert set(kafka.settings_for("consumer", _MIXED)) == _COMMON | _CONSUMING
    assert set(kafka.settings_for("admin", _MIXED)) == _COMMON
    assert kafka.settings_for("admin", _MIXED)["sasl.username"] == "u"  # values pass unchanged


def test_a_client_of_each_role_accepts_what_it_is_given() -> None:
    # librdkafka rejects the other role's callbacks (and warns about its settings).
    kafka.producer("127.0.0.1:1", {**kafka.settings_for("producer", _MIXED), "log_level": 0})
    consumer = kafka.consumer("127.0.0.1:1", "g", {**kafka.settings_for("consumer", _MIXED), "log_level": 0})
    consumer.close()
    kafka.admin("127.0.0.1:1", {**kafka.settings_for("admin", _MIXED), "log_level": 0})


def test_every_role_takes_a_librdkafka_setting_the_lists_do_not_name() -> None:
    roles: tuple[kafka.Role, ...] = ("producer", "consumer", "admin")
    for role in roles:
        assert kafka.settings_for(role, {"socket.timeout.ms": 5}) == {"socket.timeout.ms": 5}
