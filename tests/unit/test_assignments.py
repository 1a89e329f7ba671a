"""The assignment callback's side of a rebalance (coordinator/group/assignments.py), on a fake
consumer: what it assigns and pauses, which take-overs it queues for the loop, and which a
revocation, a loss or a rejoin cancels. Kafka's side is tests/coordinator/test_takeover_in_loop.py."""

from __future__ import annotations

import pytest

from coordinator.group.assignments import Assignments
from txbridge import kafka
from txbridge.kafka import TopicPartition
from txbridge.wire import Topics

TOPICS = Topics("ns")
HALF, OP = TOPICS.half, TOPICS.op


class FakeConsumer:
    """Records what the callbacks ask of the consumer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, int, int]]]] = []
        self.paused: set[tuple[str, int]] = set()

    def _note(self, what: str, partitions: list[TopicPartition]) -> None:
        self.calls.append((what, [(tp.topic, tp.partition, tp.offset) for tp in partitions]))

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._note("assign", partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._note("incremental_assign", partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._note("incremental_unassign", partitions)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}


def _tps(*pairs: tuple[str, int]) -> list[TopicPartition]:
    return [kafka.partition_at(t, n) for t, n in pairs]


def test_an_eager_assignment_is_assigned_paused_at_the_beginning_and_queued_whole() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=False)
    given = _tps((HALF, 0), (OP, 0), (HALF, 2), (OP, 2))
    assignments.give(consumer, given, served={})
    begin = kafka.OFFSET_BEGINNING
    assert consumer.calls == [
        ("assign", [(HALF, 0, begin), (OP, 0, begin), (HALF, 2, begin), (OP, 2, begin)])
    ]
    assert consumer.paused == {(HALF, 0), (OP, 0), (HALF, 2), (OP, 2)}
    assert assignments.pending()
    assert assignments.queued() == {0, 2}
    [event] = assignments.take()
    assert event.numbers == [0, 2]
    assert [(tp.topic, tp.partition) for tp in event.partitions] == [(HALF, 0), (OP, 0), (HALF, 2), (OP, 2)]
    assert not assignments.pending()


def test_an_eager_revocation_cancels_the_queued_assignment_whole() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=False)
    assignments.give(consumer, _tps((HALF, 0), (OP, 0), (HALF, 1), (OP, 1)), served={})
    assignments.cancel(_tps((HALF, 0), (OP, 0), (HALF, 1), (OP, 1)))
    assert not assignments.pending()
    assert assignments.take() == []


def test_an_incremental_number_is_queued_once_both_its_partitions_are_given() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=True)
    first = assignments.give(consumer, _tps((HALF, 0), (OP, 0), (HALF, 1)), served={})
    assert first.numbers == [0]  # 1's op partition is still on its way
    second = assignments.give(consumer, _tps((OP, 1)), served={})
    assert second.numbers == [1]  # 0 is queued already: not twice
    assert consumer.calls[0][0] == consumer.calls[1][0] == "incremental_assign"
    assert consumer.paused == {(HALF, 0), (OP, 0), (HALF, 1), (OP, 1)}
    # A number served already is not taken over again when the group gives one of its partitions.
    assignments.take()
    third = assignments.give(consumer, _tps((HALF, 2), (OP, 2)), served={0: None, 1: None})
    assert third.numbers == [2]


@pytest.mark.parametrize("going", [(HALF, 1), (OP, 1)])
def test_an_incremental_revocation_cancels_only_the_numbers_of_its_partitions(going: tuple[str, int]) -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=True)
    assignments.give(consumer, _tps((HALF, 0), (OP, 0)), served={})
    assignments.give(consumer, _tps((HALF, 1), (OP, 1)), served={})
    assignments.cancel(_tps(going))
    assert assignments.queued() == {0}
    events = assignments.take()
    assert [e.numbers for e in events] == [[0], []]
    assert going not in {(tp.topic, tp.partition) for e in events for tp in e.partitions}


def test_an_incremental_number_whose_partition_comes_back_is_queued_again() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=True)
    assignments.give(consumer, _tps((HALF, 1), (OP, 1)), served={})
    assignments.cancel(_tps((OP, 1)))
    assignments.let_go(consumer, _tps((OP, 1)))
    assert consumer.calls[-1] == ("incremental_unassign", [(OP, 1, kafka.partition_at(OP, 1).offset)])
    again = assignments.give(consumer, _tps((OP, 1)), served={})
    assert again.numbers == [1]


def test_letting_go_unassigns_only_what_was_given() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=True)
    assignments.give(consumer, _tps((HALF, 0), (OP, 0)), served={})
    assignments.let_go(consumer, _tps((HALF, 0), (HALF, 5)))
    assert [(t, n) for t, n, _ in consumer.calls[-1][1]] == [(HALF, 0)]
    before = len(consumer.calls)
    assignments.let_go(consumer, _tps((HALF, 5)))
    assert len(consumer.calls) == before  # nothing of it was given: nothing to unassign


def test_a_rejoin_forgets_the_queue_and_what_was_given() -> None:
    consumer, assignments = FakeConsumer(), Assignments(TOPICS, incremental=True)
    assignments.give(consumer, _tps((HALF, 0), (OP, 0), (HALF, 1)), served={})
    assignments.reset()
    assert not assignments.pending()
    # 1's half partition given before the rejoin does not count: the new consumer was given only its op.
    assert assignments.give(FakeConsumer(), _tps((OP, 1)), served={}).numbers == []


class SeekingConsumer:
    """A consumer whose partitions' fetchers start after ``refusals`` seeks, failing with ``code`` before."""

    def __init__(self, refusals: int, code: int) -> None:
        self.refusals, self.code = refusals, code
        self.sought: list[tuple[str, int, int]] = []
        self.metadata_asked: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> None:
        self.metadata_asked.append(topic)

    def seek(self, tp: TopicPartition) -> None:
        if self.refusals:
            self.refusals -= 1
            raise kafka.KafkaException(kafka.KafkaError(self.code))
        self.sought.append((tp.topic, tp.partition, tp.offset))


@pytest.mark.parametrize("code", [kafka.KafkaError._STATE, kafka.KafkaError._PREV_IN_PROGRESS])
def test_a_seek_waits_for_the_fetcher_to_start(code: int) -> None:
    consumer = SeekingConsumer(3, code)
    kafka.seek_started(consumer, [kafka.partition_at(HALF, 0, 7), kafka.partition_at(OP, 0, 9)], 5.0)
    assert consumer.sought == [(HALF, 0, 7), (OP, 0, 9)]


def test_a_partition_the_client_does_not_know_has_its_metadata_asked_for_and_is_sought_again() -> None:
    consumer = SeekingConsumer(2, kafka.KafkaError._UNKNOWN_PARTITION)
    kafka.seek_started(consumer, [kafka.partition_at(HALF, 0, 7)], 5.0)
    assert consumer.sought == [(HALF, 0, 7)]
    assert consumer.metadata_asked == [HALF, HALF]


def test_a_partition_still_unknown_when_the_wait_ends_raises_an_unknown_partition() -> None:
    with pytest.raises(kafka.KafkaException) as raised:
        kafka.seek_started(
            SeekingConsumer(10**6, kafka.KafkaError._UNKNOWN_PARTITION),
            [kafka.partition_at(HALF, 0, 1)],
            0.05,
        )
    assert kafka.is_unknown_partition(raised.value)


def test_a_seek_that_fails_otherwise_or_too_long_raises() -> None:
    with pytest.raises(kafka.KafkaException):
        kafka.seek_started(
            SeekingConsumer(1, kafka.KafkaError._INVALID_ARG), [kafka.partition_at(HALF, 0, 1)], 5.0
        )
    with pytest.raises(kafka.KafkaException):
        kafka.seek_started(
            SeekingConsumer(10**6, kafka.KafkaError._STATE), [kafka.partition_at(HALF, 0, 1)], 0.05
        )
