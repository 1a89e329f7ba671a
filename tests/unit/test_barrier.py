"""The database barrier, on SQLite directly and through SQLAlchemy (SQLite and a real
PostgreSQL): pure DB logic, no Kafka."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from txbridge import wire
from txbridge.barrier import SqlAlchemyBarrier, SqliteBarrier
from txbridge.errors import BarrierConflictError, ConfigurationError
from txbridge.transaction import LocalTransaction
from txbridge.wire import TxState


@pytest.fixture(params=["sqlite3", "sqlalchemy", "postgresql"])
def barrier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "postgresql":
        engine = create_engine(request.getfixturevalue("postgres_url"))
        with engine.begin() as conn:  # each test starts from empty tables
            conn.execute(text("DROP TABLE IF EXISTS orders, txbridge_barrier"))
            conn.execute(text("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER)"))
        yield SqlAlchemyBarrier(engine)
        engine.dispose()
        return
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER)")
    if request.param == "sqlite3":
        yield SqliteBarrier(path)
        return
    engine = create_engine(f"sqlite:///{path}")
    yield SqlAlchemyBarrier(engine)
    engine.dispose()


def _write_order(barrier: Any, conn: Any, order_id: str, amount: int) -> None:
    sql = "INSERT INTO orders (id, amount) VALUES (:id, :amount)"
    params = {"id": order_id, "amount": amount}
    if isinstance(barrier, SqlAlchemyBarrier):
        conn.execute(text(sql), params)
    else:
        conn.execute(sql, params)


def _orders(barrier: Any) -> list[tuple[str, int]]:
    if isinstance(barrier, SqlAlchemyBarrier):
        with barrier.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT id, amount FROM orders ORDER BY id"))]
    with sqlite3.connect(barrier._source) as conn:
        return list(conn.execute("SELECT id, amount FROM orders ORDER BY id"))


def test_commit_then_check_answers_commit(barrier: Any) -> None:
    tx_id = wire.new_tx_id()
    with barrier.local_transaction(tx_id) as conn:
        _write_order(barrier, conn, "o1", 10)
    assert barrier.check(LocalTransaction(tx_id=tx_id, group="g")) is TxState.COMMIT
    assert barrier.check(tx_id) is TxState.COMMIT  # repeated checks agree
    assert _orders(barrier) == [("o1", 10)]


def test_check_first_rolls_back_and_refuses_a_late_commit(barrier: Any) -> None:
    tx_id = wire.new_tx_id()
    assert barrier.check(LocalTransaction(tx_id=tx_id, group="g")) is TxState.ROLLBACK
    ran = []

    def late_commit() -> None:
        with barrier.local_transaction(tx_id) as conn:
            ran.append(True)
            _write_order(barrier, conn, "late", 99)

    with pytest.raises(BarrierConflictError, match="already decided"):
        late_commit()
    assert not ran
    assert _orders(barrier) == []
    assert barrier.check(tx_id) is TxState.ROLLBACK


def test_exception_in_local_transaction_rolls_back_everything(barrier: Any) -> None:
    tx_id = wire.new_tx_id()

    def failing() -> None:
        with barrier.local_transaction(tx_id) as conn:
            _write_order(barrier, conn, "o2", 5)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing()
    assert _orders(barrier) == []
    # No barrier row survived either, so the check decides ROLLBACK, and keeps to it.
    assert barrier.check(tx_id) is TxState.ROLLBACK


def test_check_waits_for_an_open_local_transaction(barrier: Any) -> None:
    """A check arriving while the local transaction is open sees its outcome, not a guess."""
    tx_id = wire.new_tx_id()
    inside = threading.Event()
    verdicts: list[TxState] = []

    def local() -> None:
        with barrier.local_transaction(tx_id) as conn:
            _write_order(barrier, conn, "o3", 7)
            inside.set()
            time.sleep(0.5)  # hold the write lock while the check starts

    worker = threading.Thread(target=local)
    worker.start()
    assert inside.wait(10)
    verdicts.append(barrier.check(tx_id))
    worker.join(10)
    assert verdicts == [TxState.COMMIT]
    assert _orders(barrier) == [("o3", 7)]


def test_many_transactions_race_checks_and_each_verdict_matches_the_database(barrier: Any) -> None:
    ids = [wire.new_tx_id() for _ in range(30)]
    verdicts: dict[str, TxState] = {}
    committed: set[str] = set()

    def local(i: int, tx_id: str) -> None:
        try:
            with barrier.local_transaction(tx_id) as conn:
                _write_order(barrier, conn, f"o{i:02}", i)
            committed.add(tx_id)
        except BarrierConflictError:
            pass

    def check(tx_id: str) -> None:
        verdicts[tx_id] = barrier.check(tx_id)

    threads = []
    for i, tx_id in enumerate(ids):
        threads.append(threading.Thread(target=local, args=(i, tx_id)))
        threads.append(threading.Thread(target=check, args=(tx_id,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {t for t, v in verdicts.items() if v is TxState.COMMIT} == committed
    assert len(_orders(barrier)) == len(committed)
    assert set(verdicts) == set(ids)


def test_table_name_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="identifier"):
        SqliteBarrier(tmp_path / "x.db", table="x; DROP TABLE y")


def test_sqlite_barrier_accepts_a_connection_factory(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    barrier = SqliteBarrier(lambda: sqlite3.connect(path, timeout=10), table="my_barrier")
    tx_id = wire.new_tx_id()
    with barrier.local_transaction(tx_id):
        pass
    assert barrier.check(tx_id) is TxState.COMMIT
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT state FROM my_barrier").fetchall() == [("committed",)]
