"""A coordinator whose wall clock is off the brokers' and the producer's, ahead or behind.

Only the coordinator's Python clock is shifted (``time.time``/``time.time_ns`` as every
``coordinator`` module reads them, and :mod:`txbridge.wire`, whose ``sign`` stamps the
back-checks' signatures); the broker, the producer and its barrier keep theirs.
What a user sees must not change: a live producer is asked about its UNKNOWN transactions
within a few check delays, each is published once, and a slow local transaction is not asked
about before the check delay (its barrier would roll it back).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.coordinator.conftest import PARTITIONS, SECRET, Env, eventually
from tests.kafka_helpers import read_topic
from txbridge import Message, SqliteBarrier, TransactionProducer, TxState

pytestmark = pytest.mark.integration

CHECK_DELAY_S = 4.0
SLOW_LOCAL_S = 1.0  # well inside the check delay: a check before the delay finds no barrier row


class _ShiftedTime:
    """The ``time`` module with its wall clock ``offset_s`` off; the monotonic clock is untouched."""

    def __init__(self, offset_s: float) -> None:
        self._offset_s = offset_s

    def time(self) -> float:
        return time.time() + self._offset_s

    def time_ns(self) -> int:
        return time.time_ns() + int(self._offset_s * 1e9)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def shift_coordinator_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], list[str]]:
    """Shift the wall clock of every loaded ``coordinator`` module and of :mod:`txbridge.wire`
    (the producer's signature check takes its clock from :mod:`txbridge.checkback`); returns
    the modules shifted."""

    def shift(offset_s: float) -> list[str]:
        import coordinator.service  # noqa: F401  (loads every part the coordinator runs)

        shifted = _ShiftedTime(offset_s)
        names = []
        for name, module in sorted(sys.modules.items()):
            ours = name in ("coordinator", "txbridge.wire") or name.startswith("coordinator.")
            if ours and _reads_time(module):
                monkeypatch.setattr(module, "time", shifted)
                names.append(name)
        return names

    return shift


def _reads_time(module: ModuleType | None) -> bool:
    return module is not None and getattr(module, "time", None) is time


# Read on the wall clock: 30 s ahead, the producer would look dead (liveness 10 s); 6 s ahead,
# live but asked before the check delay; 30 s behind, asked 30 s late; 400 s ahead, beyond the
# producer's signature tolerance too.
@pytest.mark.parametrize(
    "offset_s", [30.0, 6.0, -30.0, 400.0], ids=["ahead", "slightly-ahead", "behind", "far-ahead"]
)
def test_a_skewed_coordinator_asks_a_live_producer_in_time_and_not_early(
    env: Env,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    shift_coordinator_clock: Callable[[float], list[str]],
    offset_s: float,
) -> None:
    topic = topic_factory()
    shifted = shift_coordinator_clock(offset_s)
    assert {"coordinator.checks.backchecks", "coordinator.checks.registry"} <= set(shifted)
    barrier = SqliteBarrier(str(tmp_path / "orders.db"))
    handle = env.start(check_delay_s=CHECK_DELAY_S, producer_liveness_s=10.0)

    def commit_then(answer: TxState, *, slow_s: float = 0.0) -> Callable[[Any, Any], TxState]:
        def run(txn: Any, _arg: Any) -> TxState:
            time.sleep(slow_s)  # work before the database transaction (a call to another service)
            with barrier.local_transaction(txn.tx_id):
                pass
            return answer

        return run

    with TransactionProducer(
        env.bootstrap,
        "orders-svc",
        secret=SECRET,
        check=barrier.check,
        namespace=env.namespace,
        partitions=PARTITIONS,
        settle_unknown=False,  # the coordinator's back-check is what this test is about
    ) as producer:
        slow = producer.send_in_transaction(
            Message(topic, b"slow", key=b"s"), commit_then(TxState.COMMIT, slow_s=SLOW_LOCAL_S)
        )
        committed = [
            producer.send_in_transaction(
                Message(topic, f"c{i}".encode(), key=f"c{i}".encode()), commit_then(TxState.COMMIT)
            )
            for i in range(10)
        ]
        sent = time.monotonic()
        unknown = [
            producer.send_in_transaction(
                Message(topic, f"u{i}".encode(), key=f"u{i}".encode()), commit_then(TxState.UNKNOWN)
            )
            for i in range(4)
        ]
        expected = {r.tx_id for r in [slow, *committed, *unknown]}

        # Asked at the check delay (plus the look-ups' and commits' moments), not 30 s later, not never.
        def published() -> Counter[str]:
            return Counter(s.headers["txb.tx"].decode() for s in read_topic(env.bootstrap, topic))

        assert eventually(lambda: set(published()) >= expected, timeout=4 * CHECK_DELAY_S), (
            f"after {time.monotonic() - sent:.1f}s, {len(expected - set(published()))} of {len(expected)} "
            f"transactions unpublished (checks {handle.service.stats['checks']}, "
            f"not asked {handle.service.stats['checks_not_asked']})"
        )

    assert slow.state is TxState.COMMIT, "a check before the delay rolled the slow local transaction back"
    assert all(r.state is TxState.UNKNOWN for r in unknown)
    assert published() == Counter(dict.fromkeys(expected, 1))  # each once, nothing else
    assert handle.service.stats["check_verdicts"] >= len(unknown)
    assert handle.service.stats["resolved_rolled_back"] == 0
    # The skew is measured and exported: the coordinator's clock against the brokers'.
    assert abs(handle.service.clock.skew_ms() / 1000 - offset_s) < 2.0
