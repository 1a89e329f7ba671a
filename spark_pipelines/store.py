"""The order service's local database: one ``orders_<path>`` table per path.

SQLite by default (one file per path); any SQLAlchemy URL (PostgreSQL, ...)
when given, in which case the paths and the runs share that database and differ
by table: ``orders_<run>_<path>``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from spark_pipelines.faults import PlannedOrder
from txbridge.errors import ConfigurationError

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_RUN = re.compile(r"^[a-z0-9_]{1,40}$")


@dataclass(frozen=True)
class CommittedOrder:
    order_id: str
    customer_id: str
    customer_seq: int
    amount_cents: int
    committed_ms: int


class OrderStore:
    """The ``orders`` table of one path.

    Args:
        url: a SQLAlchemy database URL.
        path: the path name (``txbridge``, ``native``, ``plain``); the table is ``orders_<path>``.
        run: set for a database that runs share: the table is then ``orders_<run>_<path>``,
            so a run's ground truth holds only its own orders.
    """

    def __init__(self, url: str, path: str, *, run: str = "") -> None:
        if not _NAME.match(path):
            raise ConfigurationError(f"path name {path!r} must be lower-case letters, digits and _")
        if run and not _RUN.match(run):
            raise ConfigurationError(f"run tag {run!r} must be 1-40 lower-case letters, digits and _")
        self.url = url
        self._metadata = sa.MetaData()
        self.table = sa.Table(
            f"orders_{run}_{path}" if run else f"orders_{path}",
            self._metadata,
            sa.Column("order_id", sa.String(64), primary_key=True),
            sa.Column("customer_id", sa.String(64), nullable=False),
            sa.Column("customer_seq", sa.Integer, nullable=False),
            sa.Column("amount_cents", sa.BigInteger, nullable=False),
            sa.Column("committed_ms", sa.BigInteger, nullable=False),
        )
        self._engine: sa.Engine | None = None

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine, created on first use.

        Raises:
            ConfigurationError: the URL is not usable.
        """
        if self._engine is None:
            try:
                self._engine = sa.create_engine(self.url)
            except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
                raise ConfigurationError(
                    f"--db-url {self.url!r} is not a usable SQLAlchemy URL: {exc}"
                ) from exc
        return self._engine

    def create(self) -> None:
        """Create the table if missing."""
        self._metadata.create_all(self.engine, checkfirst=True)

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A database transaction: commits on clean exit, rolls back on exception."""
        with self.engine.begin() as conn:
            yield conn

    def insert(self, conn: sa.Connection, order: PlannedOrder) -> None:
        """Insert ``order`` in the open transaction ``conn``.

        ``committed_ms`` is the wall clock right before the commit: the start of
        commit-to-visible latency.
        """
        conn.execute(
            self.table.insert().values(
                order_id=order.order_id,
                customer_id=order.customer_id,
                customer_seq=order.customer_seq,
                amount_cents=order.amount_cents,
                committed_ms=int(time.time() * 1000),
            )
        )

    def committed(self) -> list[CommittedOrder]:
        """Every committed order: the ground truth."""
        t = self.table.c
        query = sa.select(t.order_id, t.customer_id, t.customer_seq, t.amount_cents, t.committed_ms)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [CommittedOrder(*row) for row in rows]

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
