"""Edges of the run itself (spark_pipelines.runner), on the real broker with real processes."""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import pytest

from spark_pipelines.faults import Fault, FaultPlan
from spark_pipelines.processes import PipelineError, coordinator_process
from spark_pipelines.runner import prepare, run_workload
from spark_pipelines.workload import SECRET_ENV, RunConfig

pytestmark = pytest.mark.integration


def test_a_producer_killed_at_the_last_order_is_still_checked_and_its_commit_published(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # The last order's producer dies between its database commit and its op record: only a
    # back-check can publish it, and some process of the group must be up to answer it.
    generated = FaultPlan.generate(seed=3, orders=4, customers=2, kill_coordinator=False)
    last = dataclasses.replace(generated.orders[-1], fault=Fault.CRASH_AFTER_DB_COMMIT)
    plan = dataclasses.replace(
        generated,
        orders=(*(dataclasses.replace(o, fault=Fault.NONE) for o in generated.orders[:-1]), last),
    )
    run_id = f"t{secrets.token_hex(4)}"
    config = RunConfig.create(run_id, kafka_bootstrap, tmp_path / run_id, check_after=1.0)
    secret = secrets.token_hex(16)
    coordinator = coordinator_process(config, secret, check_delay=1.0)
    prepare(config, ("txbridge",))
    coordinator.start()
    try:
        coordinator.wait_ready()
        result = run_workload(
            config, plan, secret=secret, coordinator=coordinator, paths=("txbridge",), settle_timeout=60
        )
    finally:
        coordinator.stop()

    assert result.paths["txbridge"].crashes == [(3, "after_db_commit")]
    assert result.unsettled == {"txbridge": 0}
    assert {o.order_id for o in config.store("txbridge").committed()} == {o.order_id for o in plan.orders}


def test_a_path_whose_producer_cannot_start_fails_the_run_and_no_other_path_runs_alone(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The paths begin their first order together; a path that never gets ready (here txbridge,
    # whose process has no check secret) must not leave native measured alone, nor hang the run.
    monkeypatch.delenv(SECRET_ENV, raising=False)
    plan = FaultPlan.generate(seed=5, orders=20, customers=2, kill_coordinator=False)
    run_id = f"t{secrets.token_hex(4)}"
    config = RunConfig.create(run_id, kafka_bootstrap, tmp_path / run_id)

    with pytest.raises(PipelineError) as raised:
        run_workload(config, plan, secret=None, paths=("txbridge", "native"), settle_timeout=10)

    assert "txbridge" in str(raised.value)
    assert config.store("native").committed() == []
    assert config.store("txbridge").committed() == []
