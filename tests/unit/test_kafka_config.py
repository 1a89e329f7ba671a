"""The librdkafka settings txbridge's clients start from (pure: no broker)."""

from __future__ import annotations

from txbridge import _kafka


def test_a_transactional_producer_retries_concurrent_transactions_quickly() -> None:
    config = _kafka.producer_config("h:9092", transactional_id="t")
    assert config["retry.backoff.ms"] == _kafka.TRANSACTIONAL_RETRY_BACKOFF_MS == 10
    assert config["transactional.id"] == "t"
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")


def test_a_plain_producer_keeps_librdkafkas_retry_backoff() -> None:
    assert "retry.backoff.ms" not in _kafka.producer_config("h:9092")


def test_the_users_settings_win() -> None:
    config = _kafka.producer_config("h:9092", {"retry.backoff.ms": 250}, transactional_id="t")
    assert config["retry.backoff.ms"] == 250
