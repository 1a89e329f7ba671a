"""A model of a partition's ownership, checked over random interleavings and faults.

Not the coordinator: a few dozen lines of Kafka (transactions, epochs, fencing, read_committed
up to the last stable offset or up to the high watermark, a cleaner that compacts as early as
Kafka allows) and of the take-over of docs/DESIGN.md ("Ownership") for one partition ``p``,
run with the coordinator's own rules of whom to fence (:func:`~coordinator.commit.ownership.to_fence`,
:func:`~coordinator.commit.ownership.late_owners`). Each commit of p publishes one item (the
position it starts from) and moves the position on by one, in one transaction: an item a
read_committed reader sees twice is exactly once broken.

Three layouts (:data:`LAYOUTS`):

- ``before``: the rules main had until this model found their holes (one owner key per
  partition; after the restore, only the last owner record by another id fenced);
- ``claims``: main's rules now, the positions a record of ``<ns>_state`` p;
- ``journal``: the same rules, with issue 41's positions journal: each incarnation writes its
  partitions' positions to one ``<ns>_state`` partition of its own, keyed (incarnation, p); a
  take-over reads them from the journal of the last owner that wrote any and writes them to
  its own before serving (docs/results/2026-11-30-half-load-gap.md). Checked here before it
  is coded.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field

from coordinator.commit.changelog import OwnerRead, live_owners
from coordinator.commit.ownership import late_owners, to_fence
from txbridge.wire import OwnerRecord

LAYOUTS = ("before", "claims", "journal")

Wait = Callable[[], bool] | None
Actor = Generator[Wait, None, None]


class Fenced(Exception):
    """The producer's epoch is no longer current: its incarnation is over."""


@dataclass(eq=False)
class Txn:
    tid: str
    epoch: int
    status: str = "open"  # open, committed, aborted


@dataclass(eq=False)
class Rec:
    offset: int
    key: object
    value: object  # None: a tombstone
    txn: Txn


@dataclass
class Log:
    records: list[Rec] = field(default_factory=list)
    end: int = 0

    def append(self, key: object, value: object, txn: Txn) -> Rec:
        rec = Rec(self.end, key, value, txn)
        self.end += 1
        self.records.append(rec)
        return rec

    def lso(self) -> int:
        return next((r.offset for r in self.records if r.txn.status == "open"), self.end)

    def stable_below(self, hw: int) -> bool:
        return all(r.txn.status != "open" for r in self.records if r.offset < hw)

    def read(self, upto: int) -> list[Rec]:
        """read_committed, every committed record below ``upto``, in offset order."""
        return [r for r in self.records if r.offset < upto and r.txn.status == "committed"]

    def compact(self, rng: random.Random) -> None:
        """The cleaner, as adversarial as Kafka allows: below a random point under the last
        stable offset, drop aborted records, records a later one of their key (below the point)
        supersedes, and tombstones nothing older of their key is left under."""
        point = rng.randint(0, self.lso())
        last: dict[object, int] = {}
        for r in self.records:
            if r.offset < point and r.txn.status == "committed":
                last[r.key] = r.offset
        kept: list[Rec] = []
        older: set[object] = set()
        for r in self.records:
            if r.offset < point:
                if r.txn.status == "aborted" or (r.txn.status == "committed" and last[r.key] != r.offset):
                    continue
                if r.value is None and r.key not in older and rng.random() < 0.5:
                    continue  # delete.retention.ms has passed
                older.add(r.key)
            kept.append(r)
        self.records = kept


def latest(records: list[Rec]) -> dict[object, Rec]:
    """Key -> its last record (tombstones drop the key), in the order of those records."""
    out: dict[object, Rec] = {}
    for r in records:
        out.pop(r.key, None)
        if r.value is not None:
            out[r.key] = r
    return out


class Kafka:
    def __init__(self, journals: int) -> None:
        self.state = Log()
        self.journals = [Log() for _ in range(journals)]
        self.output = Log()
        self.epochs: Counter[str] = Counter()
        self.open: dict[str, Txn] = {}

    def logs(self) -> Iterator[Log]:
        yield self.state
        yield from self.journals

    def init(self, tid: str) -> int:
        """init_transactions: aborts whatever the id has open and bumps its epoch (the fence)."""
        txn = self.open.pop(tid, None)
        if txn is not None:
            txn.status = "aborted"
        self.epochs[tid] += 1
        return self.epochs[tid]

    def begin(self, tid: str, epoch: int) -> Txn:
        self._check(tid, epoch)
        txn = self.open[tid] = Txn(tid, epoch)
        return txn

    def produce(self, txn: Txn, log: Log, key: object, value: object) -> None:
        self._check(txn.tid, txn.epoch)
        if txn.status != "open":
            raise Fenced(txn.tid)
        log.append(key, value, txn)

    def commit(self, txn: Txn) -> None:
        self._check(txn.tid, txn.epoch)
        if txn.status != "open":
            raise Fenced(txn.tid)
        txn.status = "committed"
        del self.open[txn.tid]

    def time_out(self, rng: random.Random) -> None:
        """transaction.timeout.ms: the broker aborts an open transaction and bumps its epoch."""
        if self.open:
            self.init(rng.choice(sorted(self.open)))

    def _check(self, tid: str, epoch: int) -> None:
        if self.epochs[tid] != epoch:
            raise Fenced(tid)


@dataclass
class Owner:
    kind: str  # claim or release
    tid: str
    journal: int
    #: Which of its incarnation's claims of p this is (a release keeps its claim's number).
    tenure: int


class Incarnation:
    """One coordinator incarnation taking ``p`` over, serving it, perhaps releasing it and
    taking it back (kept: served on from memory when nothing lies between its release and its
    new claim); every ``yield`` is a point where anything else may happen.

    Under ``before`` it follows the rules main had until the model found their holes: one owner
    key per partition, and the restore fences only the last owner record another id wrote.
    Under ``claims`` and ``journal`` it follows the coordinator's rules, with the coordinator's
    own functions (:func:`coordinator.commit.ownership.to_fence` and ``late_owners``): one owner
    key per claim, every unreleased claim fenced, and after the restore also every owner whose
    record lies after this one's claim; then the other owners' records deleted.
    """

    def __init__(self, kafka: Kafka, tid: str, layout: str, rng: random.Random) -> None:
        self.k, self.tid, self.layout, self.rng = kafka, tid, layout, rng
        self.journal = rng.randrange(len(kafka.journals))
        self.epoch = 0
        self.position = 0
        self.tenure = 0
        self.claimed_at = -1
        self.fenced: set[str] = set()

    @property
    def keyed(self) -> bool:
        return self.layout != "before"

    def owner_key(self, owner: Owner) -> object:
        return ("owner", owner.tid, owner.tenure) if self.keyed else "owner"

    def run(self) -> Actor:
        self.epoch = self.k.init(self.tid)
        yield None
        try:
            yield from self.take_over()
            while True:
                yield from self.serve(self.rng.randint(0, 3))
                if self.rng.random() < 0.5:
                    return
                released = yield from self.write_owner("release")
                yield None
                if self.rng.random() < 0.5:
                    return
                claimed = yield from self.write_owner("claim")
                if claimed != released + 1:  # anything between the release and the claim
                    yield from self.restore()
        except Fenced:
            return

    def reads(self, records: list[Rec]) -> list[OwnerRead]:
        """The owner records among ``records``, as the coordinator reads them."""
        return [
            OwnerRead(
                repr(r.key).encode(),
                r.offset,
                None if r.value is None else OwnerRecord(r.value.tid, released=r.value.kind == "release"),
            )
            for r in records
            if isinstance(r.value, Owner) or (r.value is None and r.key[:1] == ("owner",))
        ]

    def owners(self, records: list[Rec]) -> list[Owner]:
        """Each owner key's last record, oldest first (one, under one owner key)."""
        return [r.value for r in latest(records).values() if isinstance(r.value, Owner)]

    def fence(self, tids: Iterable[str]) -> Actor:
        for tid in sorted(set(tids) - self.fenced):
            self.k.init(tid)
            self.fenced.add(tid)
            yield None

    def take_over(self) -> Actor:
        # 1. the owners, up to the last stable offset; 2. fence the unreleased claims
        records = self.k.state.read(self.k.state.lso())
        if self.keyed:
            yield from self.fence(to_fence(live_owners(self.reads(records)), self.tid))
        else:
            claims = (o.tid for o in self.owners(records) if o.kind == "claim")
            yield from self.fence(tid for tid in claims if tid != self.tid)
        # 3. the claim, in a transaction of its own
        yield from self.write_owner("claim")
        yield from self.restore()

    def late(self, records: list[Rec]) -> set[str]:
        if self.keyed:
            return late_owners(self.reads(records), self.tid, self.claimed_at, self.fenced)
        # before: the last owner record read by another id, if a claim
        last = [r.value for r in records if isinstance(r.value, Owner) and r.value.tid != self.tid][-1:]
        return {o.tid for o in last if o.kind == "claim" and o.tid not in self.fenced}

    def restore(self) -> Actor:
        # 4. up to the high watermark, fencing the late owners and reading again until none
        while True:
            hw = self.k.state.end
            yield lambda hw=hw: self.k.state.stable_below(hw)
            records = self.k.state.read(hw)
            late = self.late(records)
            if not late:
                break
            yield from self.fence(late)
        found = self.owners(records)
        if self.layout == "journal":
            # the positions: in the journal of the last owner (offset order) that wrote any
            self.position = 0
            for owner in reversed(found):
                log = self.k.journals[owner.journal]
                hw = log.end
                yield lambda log=log, hw=hw: log.stable_below(hw)
                rec = latest(log.read(hw)).get((owner.tid, "p"))
                if rec is not None:
                    self.position = rec.value
                    break
        else:
            last = latest(records).get("positions")
            self.position = last.value if last else 0
        if not self.keyed:
            return
        # 5. before serving: the other owners' records deleted (under journal, also their
        # positions, and this incarnation's own written, in the same transaction)
        txn = self.k.begin(self.tid, self.epoch)
        if self.layout == "journal":
            self.k.produce(txn, self.k.journals[self.journal], (self.tid, "p"), self.position)
        current = self.owner_key(Owner("claim", self.tid, self.journal, self.tenure))
        for owner in found:
            if self.owner_key(owner) != current:
                self.k.produce(txn, self.k.state, self.owner_key(owner), None)
                if self.layout == "journal" and owner.tid != self.tid:
                    self.k.produce(txn, self.k.journals[owner.journal], (owner.tid, "p"), None)
        yield None
        self.k.commit(txn)
        yield None

    def write_owner(self, kind: str) -> Generator[Wait, None, int]:
        earlier = self.owner_key(Owner(kind, self.tid, self.journal, self.tenure))
        if kind == "claim":
            self.tenure += 1
        owner = Owner(kind, self.tid, self.journal, self.tenure)
        txn = self.k.begin(self.tid, self.epoch)
        offset = self.k.state.end
        self.k.produce(txn, self.k.state, self.owner_key(owner), owner)
        if kind == "claim" and self.keyed and self.tenure > 1:  # the released claim's record
            self.k.produce(txn, self.k.state, earlier, None)
        yield None
        self.k.commit(txn)
        if kind == "claim":
            self.claimed_at = offset
        return offset

    def serve(self, commits: int) -> Actor:
        for _ in range(commits):
            txn = self.k.begin(self.tid, self.epoch)
            self.k.produce(txn, self.k.output, "item", self.position)
            yield None
            if self.layout == "journal":
                self.k.produce(txn, self.k.journals[self.journal], (self.tid, "p"), self.position + 1)
            else:
                self.k.produce(txn, self.k.state, "positions", self.position + 1)
            yield None
            self.k.commit(txn)
            self.position += 1
            yield None


def ghost(kafka: Kafka, tid: str, rng: random.Random) -> Actor:
    """An id nobody claims with a transaction open on ``<ns>_state`` p (the ownership finding's
    ghost): it holds the last stable offset until it ends or times out."""
    epoch = kafka.init(tid)
    try:
        txn = kafka.begin(tid, epoch)
        kafka.produce(txn, kafka.state, ("ghost", tid), b"")
        for _ in range(rng.randint(1, 30)):
            yield None
        kafka.commit(txn)
    except Fenced:
        return


@dataclass
class Outcome:
    duplicates: int
    gaps: int
    items: int


def simulate(layout: str, seed: int, steps: int = 400, journals: int = 2) -> Outcome:
    """One random run: incarnations start (a standby, a restart under any name, a second member
    the group confuses), crash, stall, are fenced; ghosts open transactions; transactions time
    out; the cleaner runs. Returns what a read_committed reader of the output sees."""
    rng = random.Random(seed)
    kafka = Kafka(journals)
    actors: dict[str, tuple[Actor, Wait]] = {}
    made = 0

    def start(actor: Actor, name: str) -> None:
        actors[name] = (actor, None)

    for _ in range(steps):
        roll = rng.random()
        if roll < 0.06 or not actors:
            made += 1
            name = f"i{made}"
            start(Incarnation(kafka, name, layout, rng).run(), name)
        elif roll < 0.08:
            made += 1
            start(ghost(kafka, f"g{made}", rng), f"g{made}")
        elif roll < 0.10:
            del actors[rng.choice(sorted(actors))]  # kill -9: its open transaction stays open
        elif roll < 0.12:
            kafka.time_out(rng)
        elif roll < 0.15:
            rng.choice(list(kafka.logs())).compact(rng)
        else:
            runnable = [n for n, (_, wait) in actors.items() if wait is None or wait()]
            if not runnable:
                kafka.time_out(rng)
                continue
            name = rng.choice(sorted(runnable))
            actor, _ = actors[name]
            try:
                actors[name] = (actor, next(actor))
            except StopIteration:
                del actors[name]
    items = Counter(r.value for r in kafka.output.read(kafka.output.end))
    top = max(items, default=-1)
    return Outcome(
        duplicates=sum(n - 1 for n in items.values() if n > 1),
        gaps=sum(1 for i in range(top + 1) if i not in items),
        items=len(items),
    )
