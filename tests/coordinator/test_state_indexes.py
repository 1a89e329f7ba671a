"""PartitionState's indexes give the answers the scans of every pending transaction gave.

A seeded random walk through halves, ops, end offsets, check results, commits and
evictions checks after every step that each index-backed method equals a scan of
``pending`` (the implementation before the indexes, kept here as the oracle).
"""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter

import pytest

from coordinator.commit.changelog import decode_entry, encode_entry
from coordinator.commit.payloads import evict_states
from coordinator.state import partition as state_module
from coordinator.state import scheduler
from coordinator.state.partition import PartitionState, PendingTx, Phase
from coordinator.state.scheduler import CheckPolicy
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState, decode_half

POLICY = CheckPolicy(delay_s=5.0, max_checks=3, backoff_s=2.0, backoff_max_s=8.0)


def fresh(text: str) -> str:
    """An equal string that is not the same object, as decoding each record gives."""
    return text.encode().decode()


def half(tx: str, seq: int, key: bytes | None, value: bytes = b"v" * 40) -> HalfMessage:
    return HalfMessage(tx, seq, "orders", value, key=key, group="g", instance="i")


# ---------------------------------------------------------------- the scans, as oracles


def scan_ready_in_order(state: PartitionState) -> list[PendingTx]:
    undecided: dict[bytes, int] = {}  # per message key, the earliest first offset of an undecided tx with it
    for tx in state.pending.values():
        if tx.phase in (Phase.OPEN, Phase.COMMITTED):
            for key in {h.key for h in tx.halves.values() if h.key is not None}:
                undecided[key] = min(undecided.get(key, tx.first_offset()), tx.first_offset())
    committed = sorted(
        (t for t in state.pending.values() if t.phase in (Phase.COMMITTED, Phase.READY)),
        key=lambda t: t.decided_seq,
    )
    out = []
    for tx in committed:
        if tx.phase is not Phase.READY:
            break
        keys = {h.key for h in tx.halves.values() if h.key is not None}
        if any(undecided.get(key, tx.first_offset()) < tx.first_offset() for key in keys):
            continue
        out.append(tx)
    out.sort(key=PendingTx.first_offset)
    return out


def assert_indexes_match_scans(state: PartitionState, now_ms: int, in_flight: set[str]) -> None:
    pending = list(state.pending.values())
    assert {t.tx_id for t in state.unsaved.dirty()} == {t.tx_id for t in pending if t.dirty}
    assert state.needs_end_offset() == any(
        t.phase is Phase.COMMITTED and t.wait_offset is None for t in pending
    )
    assert state.payload_bytes == sum(t.cached_bytes() for t in pending)
    assert state.has_work() == bool(
        state.tombstones
        or state.needs_end_offset()
        or any(t.dirty or t.phase is Phase.READY for t in pending)
    )
    stats_before = Counter(state.stats)
    assert state.ready_in_order() == scan_ready_in_order(state)
    state.stats.clear()
    state.stats.update(stats_before)  # the oracle does not count held transactions
    # scheduler.due's scan, without scheduling anything itself.
    due = [
        t
        for t in state.open_txs()
        if t.tx_id not in in_flight
        and (t.next_check_ms if t.next_check_ms is not None else POLICY.first_due_ms(t, now_ms)) <= now_ms
    ]
    indexed = state.due_checks(POLICY, now_ms, in_flight)
    assert {t.tx_id for t in indexed.check} == {t.tx_id for t in due if t.checks < POLICY.max_checks}
    assert {t.tx_id for t in indexed.expire} == {t.tx_id for t in due if t.checks >= POLICY.max_checks}


class Walk:
    """The world of the random walk: one partition's state, the half offset, the clock."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = PartitionState(0, Counter())
        self.offset, self.now, self.n = 0, 1_000_000, 0
        self.in_flight: set[str] = set()
        self.sizes: dict[str, int] = {}

    def pick(self) -> PendingTx:
        return self.rng.choice(list(self.state.pending.values()))

    def new_tx(self) -> None:  # a new transaction's first half (maybe more seqs later)
        self.n += 1
        tx_id = f"t{self.n}"
        self.sizes[tx_id] = self.rng.choice([1, 1, 1, 2, 3])
        key = self.rng.choice([b"a", b"b", b"c", None, tx_id.encode()])
        msg = half(tx_id, 0, key)
        if self.rng.random() < 0.2:
            msg = msg._replace(check_after_s=self.rng.choice([0.5, 2.0, 20.0]))
        self.state.on_half(msg, self.offset, 50, self.now)
        self.offset += 1

    def more_halves(self) -> None:  # a further half of some transaction, or a duplicate
        tx = self.pick()
        seq = self.rng.randrange(self.sizes.get(tx.tx_id, 2))
        key = self.rng.choice([b"a", b"b", b"c", None])  # a transaction may carry several keys
        self.state.on_half(half(tx.tx_id, seq, key), self.offset, 50, self.now)
        self.offset += 1

    def commit(self) -> None:  # a producer COMMIT with its count, or a check COMMIT without
        tx = self.pick()
        count = self.sizes.get(tx.tx_id) if self.rng.random() < 0.7 else None
        source = OpSource.PRODUCER if count is not None else OpSource.CHECK
        self.state.on_op(OpRecord(tx.tx_id, TxState.COMMIT, source, count, "g", "i"))

    def op_first(self) -> None:  # a COMMIT read before any half
        self.n += 1
        self.sizes[f"t{self.n}"] = 1
        self.state.on_op(OpRecord(f"t{self.n}", TxState.COMMIT, OpSource.PRODUCER, 1, "g", "i"))

    def rollback(self) -> None:
        self.state.on_op(OpRecord(self.pick().tx_id, TxState.ROLLBACK, OpSource.PRODUCER, None))

    def end_offset(self) -> None:
        self.state.set_end_offset(self.offset + self.rng.randrange(3))
        for given_up in self.state.settle_waits():
            self.state.finish(given_up.tx, Phase.QUARANTINED)

    def boundary(self) -> None:  # republish, persist, evict
        for tx in self.state.ready_in_order():
            self.state.finish(tx, Phase.PUBLISHED)
        self.state.mark_persisted(self.state.unsaved.dirty(), set(self.state.tombstones))
        evict_states([self.state], self.rng.choice([0, 200, 10_000]))

    def checks(self) -> None:  # time passes; some checks go out, some come back UNKNOWN
        self.now += self.rng.choice([500, 3000, 7000])
        for tx in self.state.due_checks(POLICY, self.now, self.in_flight).check[:3]:
            if self.rng.random() < 0.5:
                self.in_flight.add(tx.tx_id)
            elif scheduler.record_unknown(POLICY, tx, self.now):
                self.state.finish(tx, Phase.EXPIRED)
        self.in_flight = {t for t in sorted(self.in_flight) if self.rng.random() < 0.7}

    def restart(self) -> None:  # a new owner restores the partition from <ns>_state
        self.boundary()
        restored = PartitionState(0, self.state.stats, half_position=self.state.half_position)
        for tx in self.state.pending.values():
            restored.add_restored(decode_entry(encode_entry(tx)))
        self.state = restored
        self.in_flight = set()

    def reread(self) -> None:  # evicted payloads read back by offset
        tx = self.pick()
        for ref in tx.ordered_halves():
            if ref.message is None:
                tx.set_payload(ref, half(tx.tx_id, 0, ref.key))


def test_random_walk_indexes_agree_with_scans() -> None:
    walk = Walk(20261122)
    actions = [
        (walk.new_tx, 30),
        (walk.more_halves, 15),
        (walk.commit, 15),
        (walk.op_first, 5),
        (walk.rollback, 7),
        (walk.end_offset, 5),
        (walk.boundary, 8),
        (walk.checks, 7),
        (walk.reread, 8),
        (walk.restart, 1),
    ]
    for _step in range(2000):
        action = walk.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
        getattr(walk, action.__name__ if walk.state.pending else "new_tx")()
        assert_indexes_match_scans(walk.state, walk.now, walk.in_flight)
    assert walk.state.stats["resolved_published"] > 50
    assert walk.state.stats["resolved_rolled_back"] > 50
    assert walk.state.stats["resolved_expired"] > 5


def test_a_one_half_transaction_keeps_no_dict_and_its_halves_are_read_only() -> None:
    state = PartitionState(0)
    tx = state.on_half(half("a", 0, b"k"), 0, 10, 1000)
    assert tx is not None
    assert isinstance(tx._halves, state_module.HalfRef)
    with pytest.raises(TypeError):
        tx.halves[1] = tx.halves[0]  # type: ignore[index]
    state.on_half(half("a", 0, b"k"), 1, 10, 1000)
    assert state.stats["duplicate_halves"] == 1
    state.on_half(half("a", 2, b"k"), 2, 10, 1000)
    state.on_half(half("a", 1, b"k"), 3, 10, 1000)
    assert sorted(tx.halves) == [0, 1, 2]
    assert [r.offset for r in tx.ordered_halves()] == [0, 3, 2]
    assert state.payload_bytes == 30


def test_repeated_strings_are_shared_between_transactions() -> None:
    state = PartitionState(0)
    # Each record decoded on its own, from headers whose names and values are fresh objects,
    # as a consumer returns them: the strings that repeat come out of decoding shared, and
    # the state keeps them so.
    sent = [
        HalfMessage(f"t{n}", 0, "orders", b"v", group="g1", instance="i1", user_headers=(("trace", b"x"),))
        for n in range(2)
    ]
    messages = [decode_half(m.value, [(fresh(name), raw) for name, raw in m.to_headers()]) for m in sent]
    txs = [state.on_half(msg, n, 10, 1000) for n, msg in enumerate(messages)]
    a, b = (t for t in txs if t is not None)
    assert a.group is b.group
    assert a.instance is b.instance
    ma, mb = a.halves[0].message, b.halves[0].message
    assert ma is not None
    assert mb is not None
    assert ma.topic is mb.topic
    assert ma.user_headers[0][0] is mb.user_headers[0][0]
    assert a.halves[0].topic is b.halves[0].topic


def test_due_checks_returns_a_due_transaction_until_it_is_rescheduled_or_decided() -> None:
    state = PartitionState(0)
    state.on_half(half("a", 0, b"k"), 0, 10, 100_000)
    state.on_half(HalfMessage("b", 0, "orders", b"v", check_after_s=1.0), 1, 10, 100_000)
    assert [t.tx_id for t in state.due_checks(POLICY, 100_999, set()).check] == []
    assert state.pending["a"].next_check_ms is None  # in the arrival-order FIFO until due
    assert [t.tx_id for t in state.due_checks(POLICY, 101_000, set()).check] == ["b"]
    state.mark_persisted(state.unsaved.dirty(), set())
    assert [t.tx_id for t in state.due_checks(POLICY, 105_000, set()).check] == ["b", "a"]
    assert state.pending["a"].next_check_ms == 105_000
    assert state.unsaved.dirty() == [state.pending["a"]]  # its check time goes to <ns>_state
    assert [t.tx_id for t in state.due_checks(POLICY, 105_000, {"b"}).check] == ["a"]
    scheduler.record_unknown(POLICY, state.pending["a"], 105_000)
    assert [t.tx_id for t in state.due_checks(POLICY, 105_001, set()).check] == ["b"]
    state.on_op(OpRecord("b", TxState.COMMIT, OpSource.CHECK, None))
    assert state.due_checks(POLICY, 106_999, set()).check == []
    assert [t.tx_id for t in state.due_checks(POLICY, 107_000, set()).check] == ["a"]


def test_check_heap_stays_bounded_when_transactions_are_decided_before_their_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(PartitionState, "debug", False)  # 40,000 steps over a ~1,000-entry heap
    state = PartitionState(0)
    for n in range(20_000):
        state.on_half(half(f"t{n}", 0, None), n, 10, 1000)
        state.on_op(OpRecord(f"t{n}", TxState.ROLLBACK, OpSource.PRODUCER, None))
    assert not state.pending
    assert len(state._check_queue._heap) <= 1024 + 1


def test_due_checks_with_stale_entries_and_frequent_heap_rebuilds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PartitionState, "CHECK_HEAP_SLACK", 0)
    state = PartitionState(0)
    for n in range(10):
        state.on_half(half(f"t{n}", 0, None), n, 10, 100_000 + n)
    for n in range(10, 40):  # decided before their check: stale heap entries
        state.on_half(half(f"t{n}", 0, None), n, 10, 100_000)
        state.on_op(OpRecord(f"t{n}", TxState.ROLLBACK, OpSource.PRODUCER, None))
    due = state.due_checks(POLICY, 105_004, set())
    assert sorted(t.tx_id for t in due.check) == [f"t{n}" for n in range(5)]
    assert [t.next_check_ms for t in state.pending.values()] == [105_000 + n for n in range(5)] + [None] * 5
    assert len(state.due_checks(POLICY, 200_000, set()).check) == 10


def test_resolved_ids_are_remembered_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "RESOLVED_MEMORY", 3)
    state = PartitionState(0)
    for n in range(5):
        state.on_op(OpRecord(f"t{n}", TxState.ROLLBACK, OpSource.PRODUCER, None))
    assert state.on_half(half("t4", 0, None), 0, 10, 1000) is None  # remembered: a late half
    assert state.on_half(half("t0", 0, None), 1, 10, 1000) is not None  # forgotten


def test_eviction_uses_running_totals_and_leaves_headroom() -> None:
    state = PartitionState(0)
    for n in range(16):
        state.on_half(half(f"t{n}", 0, None), n, 100, 1000 + n)
    assert state.payload_bytes == 1600
    assert evict_states([state], 1600) == 0
    state.on_half(half("late", 0, None), 16, 100, 5000)
    assert evict_states([state], 1600) == 300  # down to 7/8 of the budget, oldest first
    assert state.payload_bytes == 1400
    assert [t.tx_id for t in state.pending.values() if not t.cached_bytes()] == ["t0", "t1", "t2"]


def test_a_pending_transaction_costs_well_under_a_kilobyte_without_its_payload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards the slimming: what the state adds per pending transaction whose payload was evicted.

    602 B before it (a dict of halves per tx, a copy of group/instance per tx, a check
    heap entry), ~390 B after, on CPython 3.11; the tx id and key the record brought are
    not counted.
    """
    monkeypatch.setattr(PartitionState, "debug", False)  # many thousands pending: a pass per step
    count = 5000
    messages = [
        HalfMessage(
            f"0190f3a2-{n:04x}-7000-8000-{n:012x}",
            0,
            fresh("orders"),
            None,
            key=str(n).encode(),
            group=fresh("orders-service"),
            instance=fresh("host-1234-abcdef"),
        )
        for n in range(count)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        state = PartitionState(0)
        for n, msg in enumerate(messages):
            state.on_half(msg, 1_000_000 + n, 700, 1_700_000_000_000 + n)
        state.due_checks(POLICY, 1_700_000_000_000, set())
        state.mark_persisted(state.unsaved.dirty(), set())
        evict_states([state], 0)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown / count < 460
