"""Keyed messages go where Kafka's Java producer puts them (no broker: librdkafka's mock cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from txbridge import kafka
from txbridge.ordered import OrderedMessage, hash_selector
from txbridge.wire import half_partition

KEYS = [f"k{i}".encode() for i in range(50)]

# Kafka 4.1.1's Java producer, BuiltInPartitioner.partitionForKey(key, n)
# (= Utils.toPositive(Utils.murmur2(key)) % n), for k0..k49.
JAVA_12 = [5, 5, 9, 4, 4, 0, 1, 4, 2, 8, 10, 6, 9, 8, 7, 6, 5, 1, 7, 8, 10, 4, 5, 9, 6]
JAVA_12 += [6, 5, 7, 2, 10, 0, 0, 4, 1, 9, 1, 4, 5, 1, 9, 6, 8, 2, 2, 5, 10, 4, 2, 2, 1]
JAVA_4 = [int(c) for c in "11100010202210321130201122132200011101112022120221"]
# (key, partition of 4, partition of 12); an empty key is hashed like any other, not spread.
JAVA_SPECIAL = [
    (b"", 1, 9),
    (b"order-42", 0, 0),
    ("clé-ü".encode(), 2, 10),
    (b"a-little-bit-longer-string", 3, 11),
]


def test_txbridges_own_murmur2_picks_javas_partitions() -> None:
    assert [half_partition(key, 12) for key in KEYS] == JAVA_12
    assert [hash_selector(OrderedMessage("t", b"v", key=key), None, 12) for key in KEYS] == JAVA_12
    for key, of_4, of_12 in JAVA_SPECIAL:
        assert (half_partition(key, 4), half_partition(key, 12)) == (of_4, of_12)


@pytest.mark.parametrize("defaults", [{}, {"transactional_id": "coordinator-1"}])
def test_every_producer_uses_the_java_compatible_partitioner(defaults: dict[str, Any]) -> None:
    assert kafka.producer_config("h:9092", None, **defaults)["partitioner"] == "murmur2_random"


def test_the_user_may_choose_another_partitioner() -> None:
    config = kafka.producer_config("h:9092", {"partitioner": "consistent_random"}, transactional_id="t")
    assert config["partitioner"] == "consistent_random"


def _delivered_partitions(extra: dict[str, object], records: list[tuple[bytes, int | None]]) -> list[int]:
    """Produce ``(key, partition)`` records to a 4-partition topic of an in-process mock cluster."""
    producer = kafka.producer("127.0.0.1:1", {**extra, "test.mock.num.brokers": 1, "log_level": 0})
    delivered: dict[bytes, int] = {}

    def report(err: object, msg: Any) -> None:
        delivered[msg.value()] = -1 if err is not None else msg.partition()

    for index, (key, partition) in enumerate(records):
        value = str(index).encode()
        if partition is None:
            producer.produce("t", key=key, value=value, on_delivery=report)
        else:
            producer.produce("t", key=key, value=value, partition=partition, on_delivery=report)
    assert producer.flush(10) == 0
    return [delivered[str(index).encode()] for index in range(len(records))]


def test_librdkafka_puts_keys_where_java_does_and_keeps_an_explicit_partition() -> None:
    keys = [*KEYS, *(key for key, _, _ in JAVA_SPECIAL)]
    records: list[tuple[bytes, int | None]] = [(key, None) for key in keys]
    records.append((b"k0", 3))  # Java would choose 1

    partitions = _delivered_partitions({}, records)

    assert partitions == [*JAVA_4, *(of_4 for _, of_4, _ in JAVA_SPECIAL), 3]


def test_librdkafkas_own_default_would_not() -> None:
    # The yardstick above can fail: CRC32 (librdkafka's default) puts most keys elsewhere.
    partitions = _delivered_partitions({"partitioner": "consistent_random"}, [(key, None) for key in KEYS])
    assert sum(p != java for p, java in zip(partitions, JAVA_4, strict=True)) > 25
