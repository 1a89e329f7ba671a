"""Who may answer a back-check about another instance's transaction: only an instance on the
same source of truth (a barrier on the same database), or one that answers for its whole group."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from coordinator.checks.registry import RegistryView
from txbridge import SqlAlchemyBarrier, SqliteBarrier
from txbridge.transaction import check_source
from txbridge.wire import (
    SOURCE_GROUP,
    SOURCE_INSTANCE,
    HalfMessage,
    ProducerInstance,
    TxState,
    can_answer,
    decode_half,
    decode_producer,
)


@pytest.mark.parametrize(
    ("writer", "tx_source", "instance", "instance_source", "answers"),
    [
        ("a", "db:1", "a", "db:2", True),  # the writer itself, whatever it says now
        ("a", "db:1", "b", "db:1", True),  # same database
        ("a", "db:1", "b", "db:2", False),  # another database: its barrier would roll it back
        ("a", "db:1", "b", None, False),  # an instance from before sources: not for a sourced half
        ("a", SOURCE_INSTANCE, "b", SOURCE_INSTANCE, False),  # a check for its own instance only
        ("a", SOURCE_INSTANCE, "b", SOURCE_GROUP, True),  # one that answers for the group
        ("a", "db:1", "b", SOURCE_GROUP, True),
        ("a", SOURCE_GROUP, "b", SOURCE_GROUP, True),
        ("a", SOURCE_GROUP, "b", "db:1", False),
        ("a", None, "b", "db:2", True),  # a half from before sources: as before, any instance
    ],
)
def test_who_may_answer_for_whom(
    writer: str, tx_source: str | None, instance: str, instance_source: str | None, answers: bool
) -> None:
    assert (
        can_answer(writer=writer, tx_source=tx_source, instance=instance, instance_source=instance_source)
        is answers
    )


def _beat(view: RegistryView, name: str, source: str | None, seen: int = 2_500) -> None:
    record = ProducerInstance(
        "g", name, f"http://127.0.0.1/{name}", interval_s=1.0, decisive=True, source=source
    )
    view.apply(record.key(), record.encode(), seen)


def test_the_registry_offers_only_instances_that_can_answer_for_the_transactions_source() -> None:
    view = RegistryView(liveness_s=10)
    _beat(view, "a", "db:1", seen=0)  # the writer, silent since
    _beat(view, "b", "db:2")
    _beat(view, "c", "db:1")
    _beat(view, "d", SOURCE_GROUP)

    assert view.targets("g", "a", "db:1", 3_000) == [
        "http://127.0.0.1/c",
        "http://127.0.0.1/d",
        "http://127.0.0.1/a",
    ]
    assert view.targets("g", "a", SOURCE_INSTANCE, 3_000) == ["http://127.0.0.1/d", "http://127.0.0.1/a"]
    assert view.targets("g", "gone", "db:3", 3_000) == ["http://127.0.0.1/d"]
    assert view.decisive_elsewhere("g", "a", 3_000)  # c is on a's database


def test_a_gone_writer_is_not_expedited_to_an_instance_on_another_database() -> None:
    view = RegistryView(liveness_s=10)
    _beat(view, "a", "db:1", seen=0)
    _beat(view, "b", "db:2")

    assert not view.decisive_elsewhere("g", "a", 3_000)
    view.apply(b"g/a", None, 3_000)  # a leaves: what it said is remembered for its transactions
    assert not view.decisive_elsewhere("g", "a", 3_000)


def test_the_source_rides_in_half_records_and_heartbeats() -> None:
    half = HalfMessage("tx", 0, "orders", b"v", group="g", instance="a", source="db:1")
    assert decode_half(half.value, half.to_headers()).source == "db:1"
    assert (
        decode_half(b"v", HalfMessage("tx", 0, "orders", b"v", group="g", instance="a").to_headers()).source
        is None
    )
    beat = ProducerInstance("g", "a", "http://x", source=SOURCE_GROUP)
    assert decode_producer(beat.encode()).source == SOURCE_GROUP
    assert decode_producer(ProducerInstance("g", "a", "http://x").encode()).source is None


def test_a_barrier_says_its_databases_identity_and_every_instance_on_it_says_the_same(tmp_path: Path) -> None:
    first, second = SqliteBarrier(str(tmp_path / "a.db")), SqliteBarrier(str(tmp_path / "a.db"))
    other = SqliteBarrier(str(tmp_path / "b.db"))

    assert check_source(first.check) == check_source(second.check)
    assert check_source(first.check).startswith("db:")
    assert check_source(other.check) != check_source(first.check)
    with sqlite3.connect(tmp_path / "a.db") as db:  # kept in the database itself
        assert db.execute("SELECT count(*) FROM txbridge_barrier_identity").fetchone() == (1,)


def test_sqlalchemy_barriers_on_one_database_say_one_identity(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    url = f"sqlite:///{tmp_path / 'c.db'}"
    one, two = SqlAlchemyBarrier(create_engine(url)), SqlAlchemyBarrier(create_engine(url))
    assert check_source(one.check) == check_source(two.check)
    assert check_source(one.check).startswith("db:")


def test_a_check_that_is_not_a_barriers_answers_for_its_own_instance_unless_it_says_otherwise() -> None:
    def check(txn: object) -> TxState:
        return TxState.UNKNOWN

    assert check_source(check) == SOURCE_INSTANCE
    assert check_source(check, SOURCE_GROUP) == SOURCE_GROUP
    assert check_source(check, "orders-db") == "orders-db"
