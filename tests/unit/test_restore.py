"""Where a taken-over partition stands (coordinator/group/restore.py), without a broker.

The consumer and the half re-reader are fakes; the changelog's content, the positions and the
partition states are the real ones. The takeover itself, claim first and then this read, runs on
a real broker in tests/coordinator/test_ownership.py, test_failover.py and test_restart.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from coordinator.commit import changelog
from coordinator.commit.payloads import HalfRecord
from coordinator.config import CoordinatorConfig
from coordinator.group.restore import Restorer
from coordinator.monitoring.watchdog import Watchdog
from coordinator.state.partition import PendingTx, Phase
from txbridge.kafka import TopicPartition
from txbridge.wire import HalfMessage, Positions, Topics, encode_young

TOPICS = Topics("ns")


class FakeConsumer:
    def __init__(self, committed: dict[tuple[str, int], tuple[int, str | None]], low: int = 0) -> None:
        self._committed = committed
        self.low = low
        self.asked: list[tuple[str, int]] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        out = []
        for tp in partitions:
            self.asked.append((tp.topic, tp.partition))
            offset, metadata = self._committed.get((tp.topic, tp.partition), (-1001, None))
            out.append(TopicPartition(tp.topic, tp.partition, offset, metadata or ""))
        return out

    def get_watermark_offsets(self, _tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.low, self.low + 100


class FakeReader:
    def __init__(self, records: dict[int, HalfMessage]) -> None:
        self.records = records

    def read(self, _partition: int, offsets: list[int]) -> dict[int, HalfRecord]:
        return {o: HalfRecord(self.records[o], 10, 1_000) for o in offsets if o in self.records}


class RecordedPositions:
    """Where the restorer places positions: the test's own map, to see what it wrote into it."""

    def __init__(self, positions: dict[tuple[str, int], int]) -> None:
        self.positions = positions

    def place(self, topic: str, number: int, offset: int | None) -> None:
        if offset is None:
            self.positions.pop((topic, number), None)
        else:
            self.positions[(topic, number)] = offset


def restorer(positions: dict[tuple[str, int], int], reader: FakeReader | None = None) -> Restorer:
    return Restorer(
        CoordinatorConfig(bootstrap="b:1", namespace=TOPICS.namespace),
        TOPICS,
        Counter(),
        Watchdog(lambda _wedged: None),
        positions=RecordedPositions(positions),
        reader=cast(Any, reader or FakeReader({})),
    )


def half(tx: str, seq: int = 0) -> HalfMessage:
    return HalfMessage(tx, seq, "orders", b"v", key=b"k", group="g", instance="i")


def test_positions_come_from_the_changelog_and_the_group_only_for_a_partition_it_never_recorded() -> None:
    positions = {(TOPICS.half, 0): 999, (TOPICS.op, 0): 999}  # a previous owner's, now stale
    read = changelog.Restored(positions={0: Positions(half=40, op=7, young=encode_young(40, [35, 38]))})
    consumer = FakeConsumer({(TOPICS.half, 1): (12, encode_young(12, [11])), (TOPICS.op, 1): (3, None)})

    young = restorer(positions).take_positions([0, 1], read, cast(Any, consumer))

    assert positions == {(TOPICS.half, 0): 40, (TOPICS.op, 0): 7, (TOPICS.half, 1): 12, (TOPICS.op, 1): 3}
    assert young == {0: [35, 38], 1: [11]}
    assert sorted(consumer.asked) == [(TOPICS.half, 1), (TOPICS.op, 1)]  # partition 0 had its record


def test_a_partition_with_no_position_anywhere_starts_where_its_half_partition_starts() -> None:
    positions: dict[tuple[str, int], int] = {}
    consumer = FakeConsumer({}, low=5)
    rest = restorer(positions)
    young = rest.take_positions([2], changelog.Restored(), cast(Any, consumer))

    states = rest.restore([2], changelog.Restored(), young, cast(Any, consumer))

    assert positions == {}
    assert states[2].half_position == 5


def test_the_restored_state_holds_the_changelogs_transactions_and_the_young_halves_read_again() -> None:
    positions = {(TOPICS.half, 0): 40}
    kept = PendingTx("from-the-changelog", 0)
    read = changelog.Restored(pending={0: [kept]})
    reader = FakeReader({35: half("young-a"), 38: half("young-b", 0)})

    states = restorer(positions, reader).restore([0], read, {0: [35, 38]}, cast(Any, FakeConsumer({})))

    state = states[0]
    assert state.half_position == 40
    assert sorted(state.pending) == ["from-the-changelog", "young-a", "young-b"]
    assert all(tx.phase is Phase.OPEN for tx in state.pending.values())


def test_young_halves_gone_from_the_topic_are_reported_and_the_rest_restored(caplog: Any) -> None:
    reader = FakeReader({35: half("young-a")})  # 38 was deleted by retention

    states = restorer({(TOPICS.half, 0): 40}, reader).restore(
        [0], changelog.Restored(), {0: [35, 38]}, cast(Any, FakeConsumer({}))
    )

    assert sorted(states[0].pending) == ["young-a"]
    assert "1 listed half records are gone" in caplog.text
