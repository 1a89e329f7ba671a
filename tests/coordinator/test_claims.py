"""Claim and release records: a new owner fences exactly the id the last claim in ``<ns>_state``
names, whatever the coordinators are called; a partition with no claim (an older txbridge's
data) has its per-partition id fenced instead.

An earlier incarnation is made here with the coordinator's own :class:`Ownership` (its claim
records are the real ones) and left inside a Kafka transaction, as a kill -9 or a pause would
leave it. What is asserted is what a read_committed consumer of the real topic sees, and what
the earlier incarnation's producer is still allowed to do.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException

from coordinator.commit import changelog
from coordinator.commit.changelog import read_owners
from coordinator.commit.ownership import Ownership
from coordinator.group.restore import Restorer
from coordinator.monitoring.watchdog import Watchdog
from tests.coordinator.conftest import PARTITIONS, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic
from txbridge import kafka
from txbridge.errors import ProducerFencedError
from txbridge.kafka import Producer
from txbridge.wire import (
    OWNER_KEY,
    POSITIONS_KEY,
    OwnerRecord,
    Positions,
    TxState,
    half_partition,
    journal_key,
)

pytestmark = pytest.mark.integration

#: The transaction timeout of every producer here: a pass never comes from the broker timing a
#: transaction out within the test.
TIMEOUT_MS = 60_000


def _key_in(partition: int) -> bytes:
    keys = (f"key-{i}".encode() for i in itertools.count())
    return next(k for k in keys if half_partition(k, PARTITIONS) == partition)


def _txs(env: Env, topic: str, isolation: str = "read_committed") -> list[str]:
    return [s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic, isolation=isolation)]


@pytest.fixture
def incarnations(env: Env) -> Iterator[Callable[[str], Ownership]]:
    """Earlier coordinator incarnations: their producers and claims, without a coordinator loop."""
    made: list[Ownership] = []

    def make(instance_id: str) -> Ownership:
        owner = Ownership(
            env.config(instance_id=instance_id, transaction_timeout_ms=TIMEOUT_MS), Watchdog(print)
        )
        made.append(owner)
        return owner

    yield make
    for owner in made:
        owner.release_all()


def _fenced(producer: Producer) -> bool:
    """Whether ``producer``'s commit is refused because a newer owner fenced its id."""
    with pytest.raises(KafkaException) as raised:
        producer.commit_transaction(30)
    return isinstance(kafka.to_error(raised.value, "commit"), ProducerFencedError)


def _die_inside_a_transaction(owner: Ownership, env: Env, topic: str, partition: int) -> Producer:
    """``owner`` begins a transaction on ``partition`` (a message to ``topic``, a record in
    ``<ns>_state``) and stops there, as a killed or paused coordinator does; its producer."""
    producer = owner.producer()
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=f"left open by {owner.transactional_id}".encode())
    producer.produce(env.topics.state, key=b"zombie", value=None, partition=partition)
    producer.flush(30)
    return producer


def test_a_renamed_restart_fences_its_predecessor_and_publishes_at_once(
    env: Env, topic_factory: Callable[..., str], incarnations: Callable[[str], Ownership]
) -> None:
    """The previous incarnation claimed every partition and died inside a transaction that holds
    the real topic. The coordinator restarted under another name reads its id from the claim
    records and fences it: what is committed after the restart is visible, the dead
    transaction is aborted, and the dead incarnation can never commit."""
    topic = topic_factory()
    dead = incarnations("before-the-crash")
    dead.claim(range(PARTITIONS))
    dead_id = dead.transactional_id
    left_open = _die_inside_a_transaction(dead, env, topic, 0)

    handle = env.start(instance_id="after-the-crash", transaction_timeout_ms=TIMEOUT_MS)
    tx = env.producer.transaction([Msg(topic, b"after the restart", key=b"k")], TxState.COMMIT)
    # Visible only once the dead transaction, which holds the topic's last stable offset, ended:
    # well within its timeout, since nobody here waits for that.
    assert eventually(lambda: _txs(env, topic) == [tx], timeout=TIMEOUT_MS / 2000), _txs(env, topic)
    everything = [s.value for s in read_topic(env.bootstrap, topic, isolation="read_uncommitted")]
    assert f"left open by {dead_id}".encode() in everything  # it was written, and aborted

    assert _fenced(left_open)  # the dead incarnation woke up: it is fenced

    now = read_owners(env.bootstrap, env.topics.state, list(range(PARTITIONS)))
    new_id = handle.service.parts.kafka.owners.transactional_id
    # Each partition's one owner record left is the new owner's claim: the dead one's was deleted.
    assert {
        p: [(r.record.transactional_id, r.record.released) for r in reads] for p, reads in now.items()
    } == {p: [(new_id, False)] for p in range(PARTITIONS)}
    assert new_id != dead_id


def test_exactly_the_unreleased_claim_is_fenced(
    env: Env, topic_factory: Callable[..., str], incarnations: Callable[[str], Ownership]
) -> None:
    """Partition 0's last owner released it, partition 1's did not, and both are still alive.
    The new owner fences the one that did not (its open transaction aborted, its next commit
    refused); the one that released goes on committing elsewhere, unfenced."""
    topic = topic_factory()
    released, claimed = incarnations("released-it"), incarnations("kept-it")
    released.claim([0])
    released.mark([0], released=True)
    claimed.claim([1, 2])
    zombie = _die_inside_a_transaction(claimed, env, topic, 1)

    env.start(instance_id="successor", transaction_timeout_ms=TIMEOUT_MS)
    key = _key_in(1)
    tx = env.producer.transaction([Msg(topic, b"served by the successor", key=key)], TxState.COMMIT)
    assert eventually(lambda: _txs(env, topic) == [tx], timeout=TIMEOUT_MS / 2000), _txs(env, topic)

    assert _fenced(zombie)
    # The owner that released its partition was not fenced: its producer still commits.
    alive = released.producer()
    alive.begin_transaction()
    alive.produce(topic, key=b"other", value=b"still alive")
    alive.commit_transaction(30)
    assert b"still alive" in [s.value for s in read_topic(env.bootstrap, topic)]


def test_a_partition_an_older_txbridge_served_has_its_partition_id_fenced(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """The upgrade: ``<ns>_state`` has no claim record, and the older coordinator died inside a
    transaction under the partition's own id. The new owner fences that id: the transaction is
    aborted and what is committed after is visible, long before the transaction's timeout."""
    topic = topic_factory()
    legacy = kafka.producer(
        env.bootstrap,
        transactional_id=env.config().partition_transactional_id(2),
        transaction_timeout_ms=TIMEOUT_MS,
    )
    legacy.init_transactions(30)
    legacy.begin_transaction()
    legacy.produce(topic, key=b"k", value=b"from the older coordinator")
    legacy.produce(env.topics.state, key=b"zombie", value=None, partition=2)
    legacy.flush(30)

    env.start(instance_id="upgraded", transaction_timeout_ms=TIMEOUT_MS)
    tx = env.producer.transaction([Msg(topic, b"after the upgrade", key=_key_in(2))], TxState.COMMIT)
    assert eventually(lambda: _txs(env, topic) == [tx], timeout=TIMEOUT_MS / 2000), _txs(env, topic)
    assert _fenced(legacy)


def test_a_partition_a_rebalance_moves_is_taken_without_fencing_its_previous_owner(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """A second coordinator joins and the group moves some partitions to it. The first released
    them at the revocation, so the second fences nobody: the first goes on serving what it kept,
    never fenced and never joining again, and every transaction is published once."""
    topic = topic_factory()
    first = env.start(instance_id="first", static_membership=False)
    before = [
        env.producer.transaction([Msg(topic, f"before-{p}".encode(), key=_key_in(p))], TxState.COMMIT)
        for p in range(PARTITIONS)
    ]
    assert eventually(lambda: sorted(_txs(env, topic)) == sorted(before)), _txs(env, topic)

    second = env.start(instance_id="second", static_membership=False)
    assert eventually(lambda: second.service.partitions and first.service.partitions), "nothing moved"
    after = [
        env.producer.transaction([Msg(topic, f"after-{p}".encode(), key=_key_in(p))], TxState.COMMIT)
        for p in range(PARTITIONS)
    ]
    everything = sorted(before + after)
    assert eventually(lambda: sorted(_txs(env, topic)) == everything), _txs(env, topic)
    assert first.service.stats["partitions_fenced"] == 0
    assert first.service.stats["consumer_rejoins"] == 0
    owners = read_owners(env.bootstrap, env.topics.state, list(range(PARTITIONS)))
    moved = sorted(second.service.partitions)
    second_id = second.service.parts.kafka.owners.transactional_id
    assert {p: [r.record.transactional_id for r in owners[p]] for p in moved} == {
        p: [second_id] for p in moved
    }


def test_an_owner_that_released_after_the_successors_claim_is_fenced(
    env: Env,
    topic_factory: Callable[..., str],
    incarnations: Callable[[str], Ownership],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two members take partition 0 at once (a generation one of them missed): the successor
    reads the owners before the other's claim, claims after it, and the other releases it after
    that claim. The successor's restore finds the release after its own claim and fences its
    writer, who could otherwise take the partition back from memory (its new claim lies right
    after its release, the kept-partition check) and publish beside the successor.

    The interleaving is made by running the other's claim inside the successor's read of the
    owners, and its release just before the successor's restore reads the partition."""
    topic = topic_factory()
    beside = incarnations("beside")
    read_owners_of = Ownership._read_owners
    read_changelog_of = Restorer.read_changelog
    steps: list[str] = []

    def read_owners_then_the_other_claims(self: Ownership, numbers: list[int]) -> Any:
        owners = read_owners_of(self, numbers)
        if self is not beside and not steps:
            beside.claim([0])
            steps.append("claimed beside")
        return owners

    def the_other_releases_then_restore(self: Restorer, numbers: list[int]) -> changelog.Restored:
        if steps == ["claimed beside"]:
            beside.mark([0], released=True)
            steps.append("released beside")
        return read_changelog_of(self, numbers)

    monkeypatch.setattr(Ownership, "_read_owners", read_owners_then_the_other_claims)
    monkeypatch.setattr(Restorer, "read_changelog", the_other_releases_then_restore)
    env.start(instance_id="successor", transaction_timeout_ms=TIMEOUT_MS)
    assert steps == ["claimed beside", "released beside"]

    tx = env.producer.transaction([Msg(topic, b"served by the successor", key=_key_in(0))], TxState.COMMIT)
    assert eventually(lambda: _txs(env, topic) == [tx], timeout=TIMEOUT_MS / 2000), _txs(env, topic)
    # Taking partition 0 back, as a kept partition given back by the next assignment: refused.
    with pytest.raises(ProducerFencedError):
        beside.reclaim([0])
    assert _txs(env, topic) == [tx]


def test_a_partition_served_before_the_journal_resumes_from_its_positions_record(
    env: Env, topic_factory: Callable[..., str]
) -> None:
    """A txbridge from before the journal left partition 0's positions in ``<ns>_state`` 0 itself,
    past a transaction it had published, and its owner record names no journal. The new owner
    resumes from that record (the transaction is not published again), writes the positions to
    its own journal, and deletes the older record."""
    topic = topic_factory()
    key = _key_in(0)
    env.producer.transaction([Msg(topic, b"published by the older coordinator", key=key)], TxState.COMMIT)
    admin = kafka.admin(env.bootstrap)
    ends = {t: kafka.offset_bounds(admin, t, [0], timeout=10)[0][2] for t in (env.topics.half, env.topics.op)}
    older = kafka.producer(env.bootstrap, transactional_id=f"{env.namespace}-partition-0")
    older.init_transactions(30)
    older.begin_transaction()
    older.produce(env.topics.state, OwnerRecord("older", released=True).encode(), OWNER_KEY, partition=0)
    where = Positions(ends[env.topics.half], ends[env.topics.op])
    older.produce(env.topics.state, where.encode(), POSITIONS_KEY, partition=0)
    older.commit_transaction(30)

    handle = env.start(instance_id="upgraded", transaction_timeout_ms=TIMEOUT_MS)
    after = env.producer.transaction([Msg(topic, b"after the upgrade", key=key)], TxState.COMMIT)
    assert eventually(lambda: _txs(env, topic) == [after], timeout=TIMEOUT_MS / 2000), _txs(env, topic)

    live: dict[tuple[int, bytes], bytes | None] = {}
    for s in read_topic(env.bootstrap, env.topics.state):
        live[(s.partition, s.key)] = s.value
    assert live[(0, POSITIONS_KEY)] is None  # deleted by the adoption
    owner = str(handle.service.parts.kafka.owners.transactional_id)
    journal = handle.service.parts.kafka.owners.journal
    adopted = live[(journal, journal_key(owner, 0))]
    assert adopted is not None
    assert Positions.decode(adopted).half >= where.half
