"""The console's actions, through the SDK's exactly-once admin path (the one ``txbridge admin`` uses).

Each returns what to tell the operator: ``(kind, text)`` with kind ``ok``, ``already`` (a decision
made before, shown and left as it is) or ``error``. None raises for an outcome the operator
should read: a refused or failed action is a message on the page, and nothing was published
unless the message says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from txbridge.admin import AlreadyDecidedError, requeue, requeue_all, resolve
from txbridge.errors import TxBridgeError
from txbridge.wire import TxState

__all__ = ["Outcome", "redrive_all", "requeue_one", "resolve_expired"]

logger = logging.getLogger(__name__)

Outcome = tuple[str, str]


def resolve_expired(
    bootstrap: str, namespace: str, tx_id: str, decision: str, extra: Mapping[str, Any] | None
) -> Outcome:
    """Resolve an expired transaction COMMIT (publish its messages) or ROLLBACK, at most once."""
    if decision not in (TxState.COMMIT.value, TxState.ROLLBACK.value):
        return "error", f"a resolution is COMMIT or ROLLBACK, not {decision!r}"
    try:
        entry = resolve(bootstrap, tx_id, TxState(decision), namespace, extra)
    except AlreadyDecidedError as exc:
        logger.info("console: %s in %s was already decided (%s)", tx_id, namespace, exc.marker.describe())
        return "already", f"{exc}; that decision stands and was not changed"
    except TxBridgeError as exc:
        logger.warning("console: resolving %s in %s failed: %s", tx_id, namespace, exc)
        return "error", f"not resolved: {exc}"
    logger.info("console: resolved %s in %s %s by admin", tx_id, namespace, decision)
    if decision == TxState.COMMIT.value:
        return "ok", f"{tx_id}: COMMIT by admin, republished {len(entry.messages)} message(s)"
    return "ok", f"{tx_id}: ROLLBACK by admin recorded"


def requeue_one(bootstrap: str, namespace: str, tx_id: str, extra: Mapping[str, Any] | None) -> Outcome:
    """Requeue a quarantined transaction through the coordinator, at most once."""
    try:
        result = requeue(bootstrap, tx_id, namespace, extra)
    except AlreadyDecidedError as exc:
        logger.info("console: %s in %s was already requeued (%s)", tx_id, namespace, exc.marker.describe())
        return "already", f"{exc}; that decision stands and was not changed"
    except TxBridgeError as exc:
        logger.warning("console: requeuing %s in %s failed: %s", tx_id, namespace, exc)
        return "error", f"not requeued: {exc}"
    logger.info("console: requeued %s in %s as %s", tx_id, namespace, result.new_tx_id)
    done = f"requeued as {result.new_tx_id} ({result.messages} message(s))"
    return "ok", f"{tx_id}: {done}; the coordinator republishes it"


def redrive_all(bootstrap: str, namespace: str, extra: Mapping[str, Any] | None) -> list[Outcome]:
    """Requeue every requeueable quarantined transaction not requeued yet (as `requeue --all`)."""
    try:
        results = requeue_all(bootstrap, namespace, extra)
    except TxBridgeError as exc:
        return [("error", f"nothing re-driven: {exc}")]
    if not results:
        return [("ok", "no requeueable transaction in quarantine")]
    outcomes: list[Outcome] = []
    for r in results:
        if r.error:
            outcomes.append(("error", f"{r.tx_id}: not requeued: {r.error}"))
        else:
            outcomes.append(("ok", f"{r.tx_id}: requeued as {r.new_tx_id} ({r.messages} message(s))"))
    logger.info("console: re-drove %d quarantined transaction(s) in %s", len(results), namespace)
    return outcomes
