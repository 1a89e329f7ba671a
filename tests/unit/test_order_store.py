"""The demo's order store: runs that share a database (--db-url) keep their ground truths apart."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from spark_pipelines.faults import PlannedOrder
from spark_pipelines.store import OrderStore
from spark_pipelines.workload import RunConfig
from txbridge.errors import ConfigurationError


def _commit(config: RunConfig, path: str, order_id: str) -> None:
    store = config.store(path)
    store.create()
    with store.transaction() as conn:
        store.insert(conn, PlannedOrder(0, order_id, "c1", 1, 100))
    store.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_runs_sharing_a_database_see_only_their_own_orders(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # PostgreSQL is the session's real server (the demo's --db-url; its whole demo run on
    # PostgreSQL is in tests/pipelines, under make soak).
    if database == "postgresql":
        url = request.getfixturevalue("postgres_url")
        tag = secrets.token_hex(3)
    else:
        url, tag = f"sqlite:///{tmp_path / 'shared.sqlite'}", "20261122"
    first = RunConfig.create(f"run-{tag}-1", "127.0.0.1:9092", tmp_path / "a", db_url=url)
    second = RunConfig.create(f"run-{tag}-2", "127.0.0.1:9092", tmp_path / "b", db_url=url)

    _commit(first, "txbridge", "o-first")
    _commit(second, "txbridge", "o-second")

    assert [o.order_id for o in first.store("txbridge").committed()] == ["o-first"]
    assert [o.order_id for o in second.store("txbridge").committed()] == ["o-second"]
    assert first.store("txbridge").table.name == f"orders_run_{tag}_1_txbridge"


def test_without_a_shared_database_each_path_has_its_own_file_and_plain_table(tmp_path: Path) -> None:
    config = RunConfig.create("run-1", "127.0.0.1:9092", tmp_path / "run")
    (tmp_path / "run" / "db").mkdir(parents=True)  # the runner makes it

    _commit(config, "native", "o1")

    assert config.store("native").table.name == "orders_native"
    assert (tmp_path / "run" / "db" / "native.sqlite").exists()


def test_a_run_tag_that_is_not_a_plain_name_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="run tag"):
        OrderStore("sqlite://", "native", run="x; drop table")
