"""Ownership of a partition: whoever held it before, and whatever it left open, nothing is
published twice and nothing is lost.

A partition's owner commits a claim record naming its transactional id into ``<ns>_state``
before it serves the partition, so every new owner fences that id and aborts what the earlier
owner left open, whatever that owner was called; and a
restore that meets an open transaction on ``<ns>_state`` under an id no coordinator uses waits
it out rather than serve from a changelog cut short (docs/DESIGN.md).
What is asserted is what a read_committed consumer of the real topic sees.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from coordinator.commit.changelog import read_owners
from servers.coordinator_process import CoordinatorProcess
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import Seen, read_topic
from txbridge import kafka
from txbridge.wire import CheckRequest, TxState, half_partition, new_tx_id

pytestmark = pytest.mark.integration

#: Longer than any bound below: a pass never comes from the broker timing a transaction out.
DEAD_OWNER_TIMEOUT_MS = 120_000
#: A resumed zombie's partitions are served again once its fenced clients are replaced and it
#: has joined again: its consumer's close is watched for 30 s (``GroupClients.close``) and a
#: join waits for every member's revocation. 2-4 s here; CI's loaded box once took more than 30.
RESUMED_REJOIN_S = 100.0
RESUMED_SLOW_S = 20.0


def _keys_in(partition: int, count: int) -> list[bytes]:
    """``count`` order keys whose transactions go to half/op/state partition ``partition``."""
    keys = (f"key-{i}".encode() for i in itertools.count())
    return list(itertools.islice((k for k in keys if half_partition(k, PARTITIONS) == partition), count))


def _txs(seen: Iterable[Seen]) -> list[str]:
    """The transaction of each record, in the order a reader of the one-partition topic sees them."""
    return [s.headers["txb.tx"].decode() for s in seen]


def _all_visible(env: Env, topic: str, expected: Iterable[str], timeout: float = 30.0) -> bool:
    """Wait until every one of ``expected`` is visible to a read_committed reader of ``topic``."""
    wanted = set(expected)
    return bool(eventually(lambda: wanted <= set(_txs(read_topic(env.bootstrap, topic))), timeout=timeout))


def _wait_visible(env: Env, topic: str, expected: Iterable[str], timeout: float = 30.0) -> None:
    """:func:`_all_visible`, or fail the test."""
    expected = list(expected)
    assert _all_visible(env, topic, expected, timeout), f"not all of {expected} visible in {timeout:.0f}s"


def _as_names(seen: Iterable[str], named: dict[str, str]) -> list[str]:
    """``seen`` (tx ids) with each transaction of ``named`` (name -> tx id) called by its name."""
    by_tx = {tx: name for name, tx in named.items()}
    return [by_tx.get(tx, tx) for tx in seen]


def _settled(env: Env, topic: str, expected: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Once ``expected`` is visible (or ``timeout`` has passed) and a moment more for late copies:
    what ``topic`` holds."""
    _all_visible(env, topic, expected, timeout)
    time.sleep(1.0)
    return _txs(read_topic(env.bootstrap, topic))


def _committed(env: Env, topic: str, key: bytes, value: bytes) -> str:
    """A transaction committed by its producer (halves, then the COMMIT op); its tx id."""
    return env.producer.transaction([Msg(topic, value, key=key)], TxState.COMMIT)


def test_an_open_transaction_on_the_changelog_under_an_unknown_id_is_waited_out(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str]
) -> None:
    """A transaction left open on ``<ns>_state`` by a producer no coordinator knows of, and
    owners restarted under new names one after the other: every committed transaction reaches
    the real topic once, in key order, once that transaction has timed out."""
    topic = topic_factory()
    key, other = _keys_in(1, 2)  # R, L and the probes of owners 3 and 4; the probes of owners 1 and 2
    partition = half_partition(key, PARTITIONS)
    env.producer.heartbeat(check_server.url)
    check_server.script = lambda _req: TxState.COMMIT  # the producer committed all of them locally
    # offset_metadata_bytes=0: every pending transaction gets a <ns>_state entry. The first two
    # owners check late, so that R and L stay pending until their ops or a later owner's check.
    # Dynamic members leave the group when stopped, so each next owner is assigned at once (a
    # static member's partitions wait out its session).
    late: dict[str, Any] = {"offset_metadata_bytes": 0, "check_delay_s": 60.0, "static_membership": False}

    owner = env.start(instance_id="owner-1", **late)
    r, _ = env.producer.halves([Msg(topic, b"R", key=key)])
    # Visible once its commit, which covers R's half and so R's entry, is.
    probe_1 = _committed(env, topic, other, b"probe-1")
    _wait_visible(env, topic, [probe_1])
    owner.stop()

    foreign = kafka.producer(
        env.bootstrap, transactional_id=f"someone-else-{env.namespace}", transaction_timeout_ms=10_000
    )
    foreign.init_transactions(30)
    foreign.begin_transaction()
    foreign.produce(env.topics.state, key=b"someone-else", value=None, partition=partition)
    foreign.flush(30)  # and never committed (kept open while the test runs): the broker aborts it

    owner = env.start(instance_id="owner-2", **late)
    env.producer.op(r, partition, TxState.COMMIT, count=1)
    l_tx, _ = env.producer.halves([Msg(topic, b"L", key=key)])
    probe_2 = _committed(env, topic, other, b"probe-2")  # covers L's half: L has an entry
    _wait_visible(env, topic, [r, probe_2], timeout=60)
    owner.stop()

    owner = env.start(instance_id="owner-3", offset_metadata_bytes=0, static_membership=False)
    probe_3 = _committed(env, topic, key, b"probe-3")  # after R and L in key order
    _wait_visible(env, topic, [probe_3])
    owner.stop()

    env.start(instance_id="owner-4", offset_metadata_bytes=0, static_membership=False)
    env.producer.op(l_tx, partition, TxState.COMMIT, count=1)
    probe_4 = _committed(env, topic, key, b"probe-4")

    named = {
        "R": r,
        "L": l_tx,
        "probe-1": probe_1,
        "probe-2": probe_2,
        "probe-3": probe_3,
        "probe-4": probe_4,
    }
    seen = _as_names(_settled(env, topic, named.values()), named)
    assert sorted(seen) == sorted(named), f"the real topic holds {seen}"  # each once
    in_key_order = ["R", "L", "probe-3", "probe-4"]
    assert [n for n in seen if n in in_key_order] == in_key_order


def test_the_partitions_dead_owner_is_aborted_before_the_next_owner_reads(
    env: Env, topic_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that died inside a Kafka transaction under the transactional id its claim record
    names (records on the real topic and on ``<ns>_state``, no positions yet): the next owner,
    whatever its name, aborts it before it reads the partition. Its records are never visible,
    the pending transaction it tombstoned survives, and new transactions are visible long
    before its transaction could have timed out."""
    topic = topic_factory()
    key, other = _keys_in(1, 2)
    partition = half_partition(key, PARTITIONS)
    # X waits for its op, in an entry; the first owner leaves the group when it stops.
    late: dict[str, Any] = {"offset_metadata_bytes": 0, "check_delay_s": 60.0, "static_membership": False}

    owner = env.start(instance_id="before", **late)
    x, _ = env.producer.halves([Msg(topic, b"X", key=key)])
    probe = _committed(env, topic, other, b"probe")  # visible once X's entry is committed
    _wait_visible(env, topic, [probe])
    # It dies rather than stops: its partitions are never released (a clean stop releases them).
    monkeypatch.setattr(owner.service.rebalancer, "_release", lambda _numbers: None)
    owner.stop()

    # The id the partition's claim record names: the first owner's, which a zombie of it would use.
    [read] = read_owners(env.bootstrap, env.topics.state, [partition])[partition]
    claim = read.record
    assert claim is not None
    assert not claim.released
    assert claim.transactional_id.startswith(f"{env.namespace}-coord-before-")
    dead = kafka.producer(
        env.bootstrap,
        transactional_id=claim.transactional_id,
        transaction_timeout_ms=DEAD_OWNER_TIMEOUT_MS,
    )
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.produce(topic, key=key, value=b"from the dead owner")
    dead.produce(env.topics.state, key=x.encode(), value=None, partition=partition)  # X's tombstone
    dead.flush(30)  # and no offsets, no commit: it died here

    started = time.monotonic()
    env.start(instance_id="after", **late)
    env.producer.op(x, partition, TxState.COMMIT, count=1)
    y = _committed(env, topic, key, b"Y")
    seen = _settled(env, topic, [x, y])
    took = time.monotonic() - started

    assert _as_names(seen, {"probe": probe, "X": x, "Y": y}) == ["probe", "X", "Y"], f"after {took:.1f}s"
    assert took < 30, f"{took:.1f}s"
    everything = [s.value for s in read_topic(env.bootstrap, topic, isolation="read_uncommitted")]
    assert b"from the dead owner" in everything  # it was there, and it was aborted


def test_a_frozen_owner_resumed_after_a_takeover_publishes_nothing_twice(
    env: Env, check_server: CheckServer, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """An owner frozen (SIGSTOP) past its session while its back-check of Z is in flight; a new
    owner takes the partitions over and publishes Z. Resumed, with the answer (COMMIT) waiting
    on its socket, the old owner publishes nothing a second time: every committed transaction
    is visible once, in key order."""
    topic = topic_factory()
    keys = [_keys_in(p, 1)[0] for p in range(PARTITIONS)]
    key = keys[1]
    z = new_tx_id()
    zombie = CoordinatorProcess(
        env.bootstrap,
        env.namespace,
        secret=SECRET,
        log_path=tmp_path / "zombie.log",
        args=("--group-id", env.config().group_id, "--check-delay", "0.5", "--check-invariants"),
        instance_id="zombie",
    )
    pid = zombie.start().pid
    assert pid is not None
    frozen, resumed = threading.Event(), False

    def answer(request: CheckRequest) -> TxState:
        if request.tx_id == z and not frozen.is_set():  # the zombie's check: it gets COMMIT on resuming
            os.kill(pid, signal.SIGSTOP)
            frozen.set()
        return TxState.COMMIT

    try:
        check_server.script = answer
        env.producer.heartbeat(check_server.url)
        zombie.wait_ready()
        before = _committed(env, topic, key, b"before")
        _wait_visible(env, topic, [before])
        env.producer.halves([Msg(topic, b"Z", key=key)], tx_id=z)  # decided by a back-check
        assert frozen.wait(30), "the zombie never checked Z"

        env.start(instance_id="successor")  # assigned once the zombie's session expired
        during = _committed(env, topic, key, b"during")
        _wait_visible(env, topic, [z, during])

        os.kill(pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        resumed = True
        after = [_committed(env, topic, k, b"after") for k in keys]
        seen = _settled(env, topic, [before, z, during, *after], timeout=RESUMED_REJOIN_S)
        took = time.monotonic() - resumed_at
    finally:
        if frozen.is_set() and not resumed:
            os.kill(pid, signal.SIGCONT)
        zombie.stop()

    named = {"before": before, "Z": z, "during": during, **{f"after-{i}": t for i, t in enumerate(after)}}
    names = _as_names(seen, named)
    zombie_log = zombie.log_tail(40)
    assert sorted(names) == sorted(named), (  # each once
        f"the real topic holds {names} {took:.0f}s after the resume; the zombie's log ends:\n{zombie_log}"
    )
    if took > RESUMED_SLOW_S:  # a pass, but a stall worth reading about (CI once saw one past 30 s)
        warnings.warn(
            f"the resumed owner's partitions were served again {took:.0f}s after its resume; the zombie's "
            f"log ends:\n{zombie_log}",
            stacklevel=1,
        )
    in_key_order = ["before", "Z", "during", "after-1"]
    assert [n for n in names if n in in_key_order] == in_key_order
    assert len(check_server.calls_for(z)) >= 2  # both owners asked about Z
