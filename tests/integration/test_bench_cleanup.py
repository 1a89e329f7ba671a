"""The bench leaves no topics behind on the user's broker unless asked to keep them."""

from __future__ import annotations

import time

import pytest

from bench.floor import floor_latency
from bench.runner import MODES, BenchRun
from txbridge import kafka

pytestmark = pytest.mark.integration


def topic_names(bootstrap: str) -> set[str]:
    return set(kafka.admin(bootstrap).list_topics(timeout=10).topics)


def wait_until_gone(bootstrap: str, names: set[str], timeout: float = 15.0) -> set[str]:
    """The ones of ``names`` still listed after ``timeout`` (deletion completes asynchronously)."""
    deadline = time.monotonic() + timeout
    while (left := names & topic_names(bootstrap)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def run_creating_topics(bootstrap: str, *, keep_topics: bool) -> set[str]:
    with BenchRun(
        bootstrap, MODES["quick"], size=64, concurrency=1, in_flight=1, keep_topics=keep_topics
    ) as run:
        run.env.namespace("main")
        run.env.topic("raw")
        deadline = time.monotonic() + 15
        while True:  # creation, too, reaches the metadata asynchronously
            created = {name for name in topic_names(bootstrap) if name.startswith(run.env.topic_prefixes)}
            if len(created) == 7 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert len(created) == 7  # the namespace's six internal topics and the raw topic
    return created


def test_a_bench_run_deletes_every_topic_it_created(kafka_bootstrap: str) -> None:
    created = run_creating_topics(kafka_bootstrap, keep_topics=False)

    assert wait_until_gone(kafka_bootstrap, created) == set()


def test_keep_topics_leaves_them_for_inspection(kafka_bootstrap: str) -> None:
    created = run_creating_topics(kafka_bootstrap, keep_topics=True)

    assert created <= topic_names(kafka_bootstrap)


def test_the_floor_deletes_its_topics(kafka_bootstrap: str) -> None:
    before = topic_names(kafka_bootstrap)

    floor_latency(kafka_bootstrap, size=64, rate=50.0, duration_s=0.5)

    created = {name for name in topic_names(kafka_bootstrap) - before if name.startswith("bench-floor-")}
    assert wait_until_gone(kafka_bootstrap, created) == set()
    assert not {n for n in topic_names(kafka_bootstrap) - before if n.startswith("bench-floor-")}
