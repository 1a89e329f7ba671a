"""The database barrier (DTM's idea): decisive back-checks, no late commit after a rollback.

The local transaction inserts ``(tx_id, 'committed')`` in the same database
transaction as the user's writes; the back-check inserts ``(tx_id,
'rolled_back')`` if no row exists, then reads the row back. ``tx_id`` is the
primary key, so exactly one of the two wins:

- the local transaction committed first: the check reads ``committed`` => COMMIT;
- the check came first: its ``rolled_back`` row makes the local transaction's
  insert fail, so the user's writes roll back with it (:class:`BarrierConflictError`);
- both at once: the database serializes them (SQLite: ``BEGIN IMMEDIATE`` on
  both paths; PostgreSQL/MySQL: the unique index makes the check wait for the
  local transaction to end).

The check never answers UNKNOWN while the database answers.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txbridge.errors import BarrierConflictError, ConfigurationError
from txbridge.transaction import decisive
from txbridge.wire import TxState

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

COMMITTED = "committed"
ROLLED_BACK = "rolled_back"
_STATES = {COMMITTED: TxState.COMMIT, ROLLED_BACK: TxState.ROLLBACK}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: The one row of a barrier's identity table.
_IDENTITY_ROW = "barrier"


def _identity_table(table: str) -> str:
    """The table that holds the barrier's identity: its name, so it stays a plain identifier."""
    return _table_name(f"{table[:54]}_identity")


def _source(identity: str) -> str:
    return f"db:{identity}"


def _table_name(table: str) -> str:
    if not _IDENTIFIER.match(table):
        raise ConfigurationError(
            f"barrier table {table!r} must be a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )
    return table


def _tx_id(txn: Any) -> str:
    tx_id = txn if isinstance(txn, str) else getattr(txn, "tx_id", None)
    if not isinstance(tx_id, str) or not tx_id:
        raise ValueError("the barrier needs a tx id (a str, or an object with .tx_id)")
    return tx_id


def _verdict(tx_id: str, row_state: str | None) -> TxState:
    if row_state not in _STATES:
        # The row was just inserted or read in the same database transaction; anything
        # else means the table was tampered with: fail loudly rather than guess.
        raise RuntimeError(f"barrier row of {tx_id} has state {row_state!r}")
    return _STATES[row_state]


class SqliteBarrier:
    """The barrier on SQLite through the standard library (the embedded default).

    Args:
        path_or_factory: a database file path, or a callable returning a new
            ``sqlite3.Connection`` per call (the barrier closes it after use and
            switches it to manual transaction control).
        table: the barrier table, created on first use.
        timeout: seconds to wait for the database lock (a concurrent local
            transaction or check holds it).

    Example::

        barrier = SqliteBarrier("orders.db")
        with barrier.local_transaction(txn.tx_id) as conn:
            conn.execute("INSERT INTO orders VALUES (?, ?)", (order_id, amount))
    """

    def __init__(
        self,
        path_or_factory: str | Path | Callable[[], sqlite3.Connection],
        table: str = "txbridge_barrier",
        *,
        timeout: float = 30.0,
    ) -> None:
        self._source = path_or_factory
        self.table = _table_name(table)
        self.timeout = timeout
        self._ready = False
        self._lock = threading.Lock()
        self._identity: str | None = None

    def source_identity(self) -> str:
        """The identity of this barrier's database, made at its first use and kept in it (a
        table beside the barrier's): every producer instance on the same database says the same
        one, so a coordinator may ask any of them about the others' transactions, and only them.
        """
        if self._identity is None:
            table = _identity_table(self.table)
            conn = self._connect()
            try:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} (name TEXT PRIMARY KEY, identity TEXT NOT NULL)"
                )
                conn.execute(
                    f"INSERT OR IGNORE INTO {table} (name, identity) VALUES (?, ?)",  # noqa: S608
                    (_IDENTITY_ROW, uuid.uuid4().hex),
                )
                row = conn.execute(
                    f"SELECT identity FROM {table} WHERE name = ?",  # noqa: S608
                    (_IDENTITY_ROW,),
                ).fetchone()
            finally:
                conn.close()
            self._identity = _source(str(row[0]))
        return self._identity

    def _connect(self) -> sqlite3.Connection:
        if callable(self._source):
            conn = self._source()
        else:
            conn = sqlite3.connect(self._source, timeout=self.timeout)
        conn.isolation_level = None  # we issue BEGIN IMMEDIATE / COMMIT ourselves
        if not self._ready:
            with self._lock:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.table} "
                    "(tx_id TEXT PRIMARY KEY, state TEXT NOT NULL, ts_ms INTEGER NOT NULL)"
                )
                self._ready = True
        return conn

    @contextmanager
    def local_transaction(self, tx_id: str) -> Iterator[sqlite3.Connection]:
        """One database transaction holding the barrier row and the user's writes.

        Commits on clean exit, rolls back on exception.

        Raises:
            BarrierConflictError: the tx id already has a row (a back-check rolled it
                back): nothing the block would write is committed; the block does not run.
        """
        tx_id = _tx_id(tx_id)
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    f"INSERT INTO {self.table} (tx_id, state, ts_ms) VALUES (?, ?, ?)",  # noqa: S608
                    (tx_id, COMMITTED, int(time.time() * 1000)),
                )
            except sqlite3.IntegrityError:
                _rollback(conn)
                raise BarrierConflictError(
                    f"transaction {tx_id} was already decided (rolled back by a back-check): "
                    "the local commit is refused"
                ) from None
            try:
                yield conn
            except BaseException:
                _rollback(conn)
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    @decisive  # the producer may ask it itself when its local transaction ends UNKNOWN
    def check(self, txn: Any) -> TxState:
        """The decisive answer to a back-check: COMMIT or ROLLBACK.

        Args:
            txn: a :class:`~txbridge.LocalTransaction` (or a tx id).
        """
        tx_id = _tx_id(txn)
        conn = self._connect()
        try:
            # Fast path: a decided row never changes, so reading it needs no write lock
            # (checks of committed transactions then never queue on SQLite's one writer).
            row = conn.execute(
                f"SELECT state FROM {self.table} WHERE tx_id = ?",  # noqa: S608
                (tx_id,),
            ).fetchone()
            if row is not None:
                return _verdict(tx_id, row[0])
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    f"INSERT OR IGNORE INTO {self.table} (tx_id, state, ts_ms) VALUES (?, ?, ?)",  # noqa: S608
                    (tx_id, ROLLED_BACK, int(time.time() * 1000)),
                )
                row = conn.execute(
                    f"SELECT state FROM {self.table} WHERE tx_id = ?",  # noqa: S608
                    (tx_id,),
                ).fetchone()
            except BaseException:
                _rollback(conn)
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()
        return _verdict(tx_id, row[0] if row else None)


class SqlAlchemyBarrier:
    """The barrier on any SQLAlchemy engine (PostgreSQL, MySQL, SQLite, ...).

    Args:
        engine: a SQLAlchemy 2 ``Engine``.
        table: the barrier table, created on first use.

    ``local_transaction`` yields a SQLAlchemy ``Connection`` inside the transaction
    (``conn.execute(text(...))``); it commits on clean exit and rolls back on exception.
    """

    def __init__(self, engine: Engine, table: str = "txbridge_barrier") -> None:
        from sqlalchemy import BigInteger, Column, MetaData, String, Table

        self.engine = engine
        self._metadata = MetaData()
        self.table = Table(
            _table_name(table),
            self._metadata,
            Column("tx_id", String(64), primary_key=True),
            Column("state", String(16), nullable=False),
            Column("ts_ms", BigInteger, nullable=False),
        )
        self._identities = Table(
            _identity_table(table),
            self._metadata,
            Column("name", String(16), primary_key=True),
            Column("identity", String(64), nullable=False),
        )
        self._ready = False
        self._lock = threading.Lock()
        self._identity: str | None = None

    def source_identity(self) -> str:
        """See :meth:`SqliteBarrier.source_identity`."""
        if self._identity is None:
            from sqlalchemy import select
            from sqlalchemy.exc import IntegrityError

            self._ensure_table()
            query = select(self._identities.c.identity).where(self._identities.c.name == _IDENTITY_ROW)
            with self.engine.connect() as conn:
                found = conn.execute(query).scalar()
            if found is None:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(
                            self._identities.insert().values(name=_IDENTITY_ROW, identity=uuid.uuid4().hex)
                        )
                except IntegrityError:
                    pass  # another instance made it first: read it below
                with self.engine.connect() as conn:
                    found = conn.execute(query).scalar()
            self._identity = _source(str(found))
        return self._identity

    def _ensure_table(self) -> None:
        if not self._ready:
            with self._lock:
                self._metadata.create_all(self.engine, checkfirst=True)
                self._ready = True

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A write transaction; on SQLite an explicit BEGIN IMMEDIATE (pysqlite defers BEGIN)."""
        self._ensure_table()
        with self.engine.connect() as conn:
            if conn.dialect.name != "sqlite":
                with conn.begin():
                    yield conn
                return
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")

    @contextmanager
    def local_transaction(self, tx_id: str) -> Iterator[Connection]:
        """See :meth:`SqliteBarrier.local_transaction`.

        Raises:
            BarrierConflictError: the tx id already has a row; nothing is committed.
        """
        from sqlalchemy.exc import IntegrityError

        tx_id = _tx_id(tx_id)
        conflict = False
        try:
            with self._transaction() as conn:
                try:
                    conn.execute(self.table.insert().values(tx_id=tx_id, state=COMMITTED, ts_ms=_now_ms()))
                except IntegrityError:
                    conflict = True
                    raise
                yield conn
        except IntegrityError as exc:
            if conflict:
                raise BarrierConflictError(
                    f"transaction {tx_id} was already decided (rolled back by a back-check): "
                    "the local commit is refused"
                ) from exc
            raise

    @decisive  # the producer may ask it itself when its local transaction ends UNKNOWN
    def check(self, txn: Any) -> TxState:
        """The decisive answer to a back-check: COMMIT or ROLLBACK."""
        from sqlalchemy import select

        tx_id = _tx_id(txn)
        self._ensure_table()
        query = select(self.table.c.state).where(self.table.c.tx_id == tx_id)
        with self.engine.connect() as conn:
            decided = conn.execute(query).scalar()  # fast path: a decided row never changes
        if decided is not None:
            return _verdict(tx_id, decided)
        with self._transaction() as conn:
            self._insert_if_absent(conn, tx_id)
            state = conn.execute(query).scalar()
        return _verdict(tx_id, state)

    def _insert_if_absent(self, conn: Connection, tx_id: str) -> None:
        from sqlalchemy.exc import IntegrityError

        values = {"tx_id": tx_id, "state": ROLLED_BACK, "ts_ms": _now_ms()}
        dialect = conn.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            conn.execute(
                pg_insert(self.table).values(**values).on_conflict_do_nothing(index_elements=["tx_id"])
            )
        elif dialect == "sqlite":
            conn.execute(self.table.insert().prefix_with("OR IGNORE").values(**values))
        elif dialect in ("mysql", "mariadb"):
            conn.execute(self.table.insert().prefix_with("IGNORE").values(**values))
        else:
            try:
                with conn.begin_nested():
                    conn.execute(self.table.insert().values(**values))
            except IntegrityError:
                pass  # a row exists: it is the verdict, read below


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite rolls back by itself on some errors (disk full, interrupt); ROLLBACK would then fail.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _now_ms() -> int:
    return int(time.time() * 1000)
