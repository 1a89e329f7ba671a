"""Where a taken-over partition stands (coordinator/group/restore.py), without a broker.

The consumer and the half re-reader are fakes; the changelog's content, the positions and the
partition states are the real ones. The takeover itself, claim first and then this read, runs on
a real broker in tests/coordinator/test_ownership.py, test_failover.py and test_restart.py.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest

from coordinator.commit import changelog
from coordinator.commit.payloads import HalfRecord
from coordinator.config import CoordinatorConfig
from coordinator.group.restore import Restorer
from coordinator.monitoring.watchdog import Watchdog
from coordinator.state.partition import PendingTx, Phase
from txbridge import positions as group_positions
from txbridge.errors import ConfigurationError
from txbridge.kafka import KafkaError, KafkaException, TopicPartition
from txbridge.wire import HalfMessage, Positions, Topics, encode_young

TOPICS = Topics("ns")


class FakeConsumer:
    """The coordinators' group's committed offsets (an older txbridge's positions)."""

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


class FakeAdmin:
    """The positions group's committed offsets through the admin API (ListConsumerGroupOffsets)."""

    def __init__(self, committed: dict[tuple[str, int], tuple[int, str | None]]) -> None:
        self._committed = committed
        self.asked: list[tuple[str, int]] = []
        self.refusals: list[KafkaError] = []  # the next requests fail with these (the group's error)
        self.partition_errors: list[KafkaError] = []  # the next answers give every partition these

    def list_consumer_group_offsets(self, asked: list[Any], **options: Any) -> dict[str, Future[Any]]:
        assert options["require_stable"]
        (request,) = asked
        answer: Future[Any] = Future()
        if self.refusals:
            answer.set_exception(KafkaException(self.refusals.pop(0)))
            return {request.group_id: answer}
        error = self.partition_errors.pop(0) if self.partition_errors else None
        found = []
        for tp in request.topic_partitions:
            self.asked.append((tp.topic, tp.partition))
            offset, metadata = self._committed.get((tp.topic, tp.partition), (-1001, None))
            # a TopicPartition's error cannot be set from Python
            found.append(
                SimpleNamespace(
                    topic=tp.topic, partition=tp.partition, offset=offset, metadata=metadata, error=error
                )
            )
        answer.set_result(SimpleNamespace(topic_partitions=found))
        return {request.group_id: answer}


class FakeReader:
    def __init__(self, records: dict[int, HalfMessage]) -> None:
        self.records = records

    def read(self, _partition: int, offsets: list[int]) -> dict[int, HalfRecord]:
        return {o: HalfRecord(self.records[o], 10, 1_000) for o in offsets if o in self.records}


class PlacedPositions:
    """Where the restorer places positions: the test's own map, to see what it wrote into it."""

    def __init__(self, positions: dict[tuple[str, int], int]) -> None:
        self.positions = positions

    def place(self, topic: str, number: int, offset: int | None) -> None:
        if offset is None:
            self.positions.pop((topic, number), None)
        else:
            self.positions[(topic, number)] = offset


def restorer(
    positions: dict[tuple[str, int], int], reader: FakeReader | None = None, group: FakeAdmin | None = None
) -> Restorer:
    """A restorer whose positions group answers from ``group`` (default: nothing committed)."""
    admin = group or FakeAdmin({})
    return Restorer(
        CoordinatorConfig(bootstrap="b:1", namespace=TOPICS.namespace),
        TOPICS,
        Counter(),
        Watchdog(lambda _wedged: None),
        positions=PlacedPositions(positions),
        read_positions=lambda numbers: group_positions.read(cast(Any, admin), TOPICS, numbers, 10),
        reader=cast(Any, reader or FakeReader({})),
    )


def half(tx: str, seq: int = 0) -> HalfMessage:
    return HalfMessage(tx, seq, "orders", b"v", key=b"k", group="g", instance="i")


def test_positions_come_from_the_positions_group_then_a_record_then_the_coordinators_group() -> None:
    positions = {(TOPICS.half, 0): 999, (TOPICS.op, 0): 999}  # a previous owner's, now stale
    group = FakeAdmin({(TOPICS.half, 0): (50, encode_young(50, [49])), (TOPICS.op, 0): (9, None)})
    read = changelog.Restored(
        positions={  # earlier txbridges' records: partition 0's is older than its group offsets
            0: Positions(half=40, op=7, young=encode_young(40, [35, 38])),
            1: Positions(half=30, op=4, young=""),
        }
    )
    consumer = FakeConsumer({(TOPICS.half, 2): (12, encode_young(12, [11])), (TOPICS.op, 2): (3, None)})

    young = restorer(positions, group=group).take_positions([0, 1, 2], read, cast(Any, consumer))

    assert positions == {
        (TOPICS.half, 0): 50,
        (TOPICS.op, 0): 9,
        (TOPICS.half, 1): 30,
        (TOPICS.op, 1): 4,
        (TOPICS.half, 2): 12,
        (TOPICS.op, 2): 3,
    }
    assert young == {0: [49], 1: [], 2: [11]}
    assert sorted(group.asked) == sorted((t, n) for n in (0, 1, 2) for t in (TOPICS.half, TOPICS.op))
    assert sorted(consumer.asked) == [(TOPICS.half, 2), (TOPICS.op, 2)]  # only the one never recorded


@pytest.mark.parametrize("code", [KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
def test_a_partition_answered_with_an_error_is_read_again_not_resumed_from_its_start(code: int) -> None:
    positions: dict[tuple[str, int], int] = {}
    group = FakeAdmin({(TOPICS.half, 0): (50, None), (TOPICS.op, 0): (9, None)})
    group.partition_errors.append(KafkaError(code))

    restorer(positions, group=group).take_positions([0], changelog.Restored(), cast(Any, FakeConsumer({})))

    assert positions == {(TOPICS.half, 0): 50, (TOPICS.op, 0): 9}
    assert len(group.asked) == 4  # asked twice


def test_a_positions_group_the_principal_may_not_read_stops_with_what_to_grant() -> None:
    group = FakeAdmin({})
    group.refusals.append(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))

    with pytest.raises(ConfigurationError, match=r"grant it Read on that group") as refused:
        restorer({}, group=group).take_positions([0], changelog.Restored(), cast(Any, FakeConsumer({})))
    assert "txbridge-positions.ns" in str(refused.value)


def test_a_partition_restored_from_a_positions_record_deletes_it_at_its_next_commit() -> None:
    read = changelog.Restored(positions={0: Positions(half=40, op=7, young="")})

    states = restorer({(TOPICS.half, 0): 40}).restore([0, 1], read, {}, cast(Any, FakeConsumer({})))

    assert states[0].positions_record
    assert not states[1].positions_record


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
