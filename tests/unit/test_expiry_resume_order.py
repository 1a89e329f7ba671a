"""The expiry resumer resolves a returning group's expired transactions in the producers' order.

Expiry order is not that order: each transaction expires when its own back-checks run
out, and those end in whatever order the endpoints answer. A same-key pair that expired
in the reverse of its half order must still be published in half order (the order every
other republish keeps). The Kafka side of a resolution is tested in
``tests/coordinator/test_expiry_resume.py``; here ``list_expired`` and ``resolve`` are
replaced, so the order is the resumer's own choice and nothing else's.
"""

from __future__ import annotations

from typing import Any

import pytest

import txbridge.admin
from coordinator.checks.checker import CheckJob, CheckResult
from coordinator.checks.resume import ExpiryResumer, Return
from coordinator.monitoring.metrics import Stat
from txbridge.admin import ExpiredTx
from txbridge.wire import HalfMessage, TxState


class _AlwaysCommit:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def check_batch(self, jobs: list[CheckJob]) -> list[CheckResult]:
        self.asked.extend(job.request.tx_id for job in jobs)
        return [CheckResult(job, TxState.COMMIT, "scripted") for job in jobs]


def _expired(tx_id: str, partition: int, first_offset: int, group: str = "orders") -> ExpiredTx:
    half = HalfMessage(tx_id, 0, "payments", b"v", key=b"k", group=group, instance="i-1")
    return ExpiredTx(tx_id, group, partition=partition, first_offset=first_offset, messages=[half])


def _resume(monkeypatch: pytest.MonkeyPatch, listed: list[ExpiredTx], *, limit: int = 100) -> tuple:
    resolved: list[str] = []

    def resolve(_bootstrap: str, tx_id: str, state: TxState, *_args: Any, **_kwargs: Any) -> None:
        assert state is TxState.COMMIT
        resolved.append(tx_id)

    def list_expired(*_args: Any, wait_for_open: bool = False) -> list[ExpiredTx]:
        assert wait_for_open, "an expiry still being committed must be listed too"
        return list(listed)

    monkeypatch.setattr(txbridge.admin, "list_expired", list_expired)
    monkeypatch.setattr(txbridge.admin, "resolve", resolve)
    checker = _AlwaysCommit()
    resumer = ExpiryResumer(
        "unused:9092",
        "ns",
        checker,
        owned=lambda: {0, 1},
        limit=limit,  # type: ignore[arg-type]
    )
    resumer._resume(Return("orders", (("i-1", None, "http://producer"),)))
    return checker.asked, resolved, resumer.events()


def test_same_key_transactions_expired_out_of_half_order_are_published_in_half_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # <ns>_expired holds them in expiry order: the later half (offset 7) expired first.
    listed = [_expired("later", 0, 7), _expired("earlier", 0, 3)]

    asked, resolved, events = _resume(monkeypatch, listed)

    assert asked == ["earlier", "later"]
    assert resolved == ["earlier", "later"]
    assert events.count(Stat.EXPIRED_RESUMED) == 2


def test_the_per_return_limit_takes_the_earliest_halves_and_skips_other_groups_and_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = [
        _expired("p1-late", 1, 9),
        _expired("p0-late", 0, 8),
        _expired("not-mine", 2, 1),  # a partition another coordinator owns
        _expired("other-group", 0, 0, group="billing"),
        _expired("p0-early", 0, 2),
        _expired("p1-early", 1, 4),
    ]

    asked, resolved, _ = _resume(monkeypatch, listed, limit=3)

    assert resolved == ["p0-early", "p0-late", "p1-early"]
    assert asked == resolved
