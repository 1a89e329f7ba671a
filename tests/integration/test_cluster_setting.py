"""``kafka.set_cluster_setting``: a broker setting changed on every broker, then given back."""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource, ConfigSource

from txbridge import kafka

# Harmless to the tests running beside this one: how long the log cleaner sleeps when it finds
# nothing to clean (a broker's default is 15,000 ms).
SETTING = "log.cleaner.backoff.ms"


def _described(bootstrap: str) -> list[tuple[str, int]]:
    """Each broker's value of :data:`SETTING` and where it comes from."""
    client = kafka.admin(bootstrap)
    brokers = client.list_topics(timeout=10).brokers
    resources = [ConfigResource(kafka.ResourceType.BROKER, str(broker)) for broker in brokers]
    return [
        (entries[SETTING].value, entries[SETTING].source)
        for entries in (future.result(10) for future in client.describe_configs(resources).values())
    ]


def test_a_setting_is_set_on_every_broker_and_deleted_back_to_the_static_one(kafka_bootstrap: str) -> None:
    before = _described(kafka_bootstrap)
    assert all(source != ConfigSource.DYNAMIC_BROKER_CONFIG.value for _, source in before)

    kafka.set_cluster_setting(kafka_bootstrap, SETTING, "15001")
    try:
        assert _described(kafka_bootstrap) == [("15001", ConfigSource.DYNAMIC_BROKER_CONFIG.value)] * len(
            before
        )
    finally:
        kafka.set_cluster_setting(kafka_bootstrap, SETTING, None)

    assert _described(kafka_bootstrap) == before
