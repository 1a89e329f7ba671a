"""What a real coordinator's /metrics serves to the dashboard and the alert rules of compose/.

One coordinator on the local broker, scraped as Prometheus would: a committed transaction, one
its producer answers with a 503 (a failed request) and then UNKNOWN until it expires, one of a
group nobody can be asked about (past its check budget), and a Kafka transaction left open on
``<ns>_state`` (its last stable offset stuck). Each metric the dashboard and the alerts read
moves with them, and every name they use is one this coordinator serves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.group import health
from servers.broker import free_port
from servers.coordinator_process import CoordinatorProcess
from tests.coordinator.check_server import CheckServer, Misbehaviour
from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.coordinator.wire_producer import Msg, WireProducer
from tests.kafka_helpers import wait_for
from tests.unit.test_alerts import names_used
from txbridge import kafka
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """``{(sample name, labels): value}`` as Prometheus reads the coordinator's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_the_metrics_follow_what_the_coordinator_does(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "STATE_LOOK_INTERVAL_S", 0.2)
    topic = topic_factory()
    check_server.script = lambda _req: TxState.UNKNOWN
    # The first request is answered 503: an UNKNOWN answer to the transaction, a failed request.
    check_server.misbehave = lambda number, _checks: Misbehaviour(status=503) if number == 1 else None
    env.producer.heartbeat(check_server.url)
    port = free_port()
    # A check budget of 0.5 + 0.3 + 2 * 0.5 = 1.8 s; the UNKNOWN one expires after two answers.
    handle = env.start(metrics_port=port, max_checks=2, check_timeout_s=0.5, check_backoff_s=0.3)
    coordinator = handle.service
    m = "txbridge_coordinator_"

    started = scrape(port)
    assert value(started, f"{m}info", namespace=env.namespace, group=coordinator.config.group_id,
                 instance_id=coordinator.config.instance_id) == 1.0  # fmt: skip
    assert value(started, f"{m}ready") == 1.0
    assert value(started, f"{m}rebalances_total") >= 1.0
    assert value(started, f"{m}check_budget_seconds") == pytest.approx(1.8)
    assert value(started, f"{m}commit_to_visible_seconds_count") == 0.0

    committed = env.producer.transaction([Msg(topic, b"paid", key=b"k1")], TxState.COMMIT)
    unknown = env.producer.transaction([Msg(topic, b"maybe", key=b"k2")], TxState.UNKNOWN)
    ghosts = WireProducer(env.bootstrap, env.namespace, PARTITIONS, group=f"ghosts-{uuid.uuid4().hex[:6]}")
    ghost, _ = ghosts.halves([Msg(topic, b"nobody to ask", key=b"k3")])
    assert [s.headers["txb.tx"] for s in wait_for(env.bootstrap, topic, 1)] == [committed.encode()]

    def settled() -> Samples | None:
        samples = scrape(port)
        expired = value(samples, f"{m}resolved_expired_total") >= 1
        return samples if expired and value(samples, f"{m}pending_past_check_budget") >= 1 else None

    samples = eventually(settled, timeout=30)
    assert samples is not None, "no expiry, or no transaction past its check budget"
    assert value(samples, f"{m}commit_to_visible_seconds_count") == 1.0
    assert 0 < value(samples, f"{m}commit_to_visible_seconds_sum") < 30
    assert value(samples, f"{m}checks_unknown_total") == 2.0  # the two answers before the expiry
    assert value(samples, f"{m}check_request_seconds_count", group=env.producer.group) == 2.0
    assert (
        value(samples, f"{m}check_request_failures_total", group=env.producer.group, kind="http_error") == 1.0
    )
    assert len(check_server.calls_for(unknown)) == 2
    # The ghost's transaction is all that is pending: past its budget, in its age band.
    assert value(samples, f"{m}pending_transactions") == 1.0
    assert 1.8 < value(samples, f"{m}oldest_pending_age_seconds") < 30
    bands = {
        dict(k)["age"]: v for (name, k), v in samples.items() if name == f"{m}pending_transactions_by_age"
    }
    assert bands == {"0-10s": 1.0, "10s-1m": 0.0, "1m-5m": 0.0, "5m-15m": 0.0, "15m-1h": 0.0, "1h+": 0.0}
    assert ghost in {tx for s in coordinator.partitions.values() for tx in s.pending}

    # Every partition of <ns>_state is looked up; between the coordinator's commits, none is behind.
    state = env.topics.state
    every = {str(p): 0.0 for p in range(_partitions(env, state))}
    assert eventually(lambda: _by_partition(scrape(port), f"{m}state_lso_lag") == every, timeout=30)

    # A transaction left open on <ns>_state partition 0 holds its last stable offset.
    hanging = kafka.producer(env.bootstrap, transactional_id=f"hanging-{uuid.uuid4().hex[:6]}")
    kafka.init_transactions(hanging, 30)
    hanging.begin_transaction()
    hanging.produce(state, key=b"hanging", value=b"open", partition=0)
    hanging.flush(30)
    try:
        stuck = eventually(lambda: _stuck(scrape(port), m), timeout=30)
        assert stuck is not None, "the stuck last stable offset was not seen"
        lag, seconds = stuck
        assert lag["0"] >= 1.0
        assert seconds["0"] > 0.0
        assert set(seconds) == set(every)
    finally:
        hanging.abort_transaction(30)
    assert eventually(lambda: _by_partition(scrape(port), f"{m}state_lso_stuck_seconds").get("0") == 0.0)

    # Every metric the dashboard and the alert rules read is one this coordinator serves.
    served = {name for name, _ in scrape(port)}
    assert names_used() - served == set()


def test_a_lost_session_and_the_rebalances_are_counted(env: Env, tmp_path: Path) -> None:
    """A coordinator process frozen past its session (a stalled machine): resumed, it counts the
    session lost, joins again and is ready, with one more assignment counted."""
    port = free_port()
    m = "txbridge_coordinator_"
    process = CoordinatorProcess(
        env.bootstrap,
        env.namespace,
        secret=SECRET,
        log_path=tmp_path / "coordinator.log",
        args=("--group-id", env.config().group_id, "--metrics-port", str(port)),
    )
    process.start()
    try:
        process.wait_ready()
        before = eventually(lambda: scrape(port))
        assert value(before, f"{m}sessions_lost_total") == 0.0
        assert value(before, f"{m}ready") == 1.0

        process.pause()
        time.sleep(10)  # past the session timeout (6 s on one broker)
        process.resume()

        def joined_again() -> Samples | None:
            samples = scrape(port)
            lost = value(samples, f"{m}sessions_lost_total") >= 1
            rejoined = value(samples, f"{m}rebalances_total") > value(before, f"{m}rebalances_total")
            return samples if lost and rejoined and value(samples, f"{m}ready") == 1.0 else None

        after = eventually(joined_again, timeout=60)
        assert after is not None, process.log_tail(20)
        assert value(after, f"{m}sessions_lost_total") == 1.0
        assert value(after, f"{m}rebalances_total") > value(before, f"{m}rebalances_total")
    finally:
        process.resume()
        process.stop()


def _by_partition(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["partition"]: v for (n, labels), v in samples.items() if n == name}


def _stuck(samples: Samples, m: str) -> tuple[dict[str, float], dict[str, float]] | None:
    lag = _by_partition(samples, f"{m}state_lso_lag")
    seconds = _by_partition(samples, f"{m}state_lso_stuck_seconds")
    return (lag, seconds) if seconds.get("0", 0.0) > 0.0 else None


def _partitions(env: Env, topic: str) -> int:
    return len(kafka.admin(env.bootstrap).list_topics(topic, timeout=10).topics[topic].partitions)
