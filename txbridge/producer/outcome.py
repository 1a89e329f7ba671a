"""How a transaction's outcome is decided: the local transaction's answer and RocketMQ's rules.

A local transaction that raises is UNKNOWN (the back-check decides), and an answer
that is not a :class:`~txbridge.TxState` is UNKNOWN too, never COMMIT. A producer
whose check is decisive settles an UNKNOWN itself by asking the check at once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from txbridge.producer.settings import ExecuteFunction, ProducerSettings
from txbridge.transaction import LocalTransaction, coerce_state, is_decisive
from txbridge.wire import TxState

logger = logging.getLogger(__name__)


def run_local(
    execute: ExecuteFunction, txn: LocalTransaction, arg: Any
) -> tuple[TxState, BaseException | None]:
    """Run the user's local transaction: its answer as a TxState, an exception as UNKNOWN."""
    try:
        answer = execute(txn, arg)
    except Exception as exc:  # RocketMQ's rule: the local transaction's failure is UNKNOWN, not ROLLBACK
        return local_failure(txn, exc)
    return checked_answer(txn, answer), None


async def run_local_async(
    execute: ExecuteFunction, txn: LocalTransaction, arg: Any
) -> tuple[TxState, BaseException | None]:
    """:func:`run_local` for the asyncio producer: ``execute`` may be ``async``."""
    try:
        answer = execute(txn, arg)
        if not isinstance(answer, TxState) and inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # RocketMQ's rule: a failed local transaction is UNKNOWN
        return local_failure(txn, exc)
    return checked_answer(txn, answer), None


def local_failure(txn: LocalTransaction, exc: Exception) -> tuple[TxState, BaseException]:
    """RocketMQ's rule: a local transaction that raised is UNKNOWN (the back-check decides)."""
    logger.warning(
        "local transaction %s raised %s: leaving it UNKNOWN for the back-check", txn.tx_id, type(exc).__name__
    )
    return TxState.UNKNOWN, exc


def checked_answer(txn: LocalTransaction, answer: Any) -> TxState:
    """The local transaction's answer as a TxState; anything else is UNKNOWN (logged), never COMMIT."""
    if answer is TxState.COMMIT or answer is TxState.ROLLBACK:
        return answer
    state = coerce_state(answer)
    if state is TxState.RUNNING:  # a back-check answer; as an outcome it leaves the decision open
        return TxState.UNKNOWN
    if state is TxState.UNKNOWN and answer is not TxState.UNKNOWN:
        logger.warning("local transaction %s answered %r, not a TxState: UNKNOWN", txn.tx_id, answer)
    return state


#: After a local transaction ends UNKNOWN, a producer whose check is decisive asks it at once,
#: then after these waits, before it leaves the outcome to the coordinator's back-check.
SETTLE_WAITS_S = (0.0, 0.05, 0.25)
SETTLED_REASON = "UNKNOWN settled by the producer's own decisive check"


def settles_unknown(settings: ProducerSettings, check: Callable[..., Any]) -> bool:
    """Whether the producer asks ``check`` itself after an UNKNOWN: ``settle_unknown`` when set,
    else only for a check marked :func:`~txbridge.transaction.decisive` (the barrier's)."""
    return settings.settle_unknown if settings.settle_unknown is not None else is_decisive(check)


def settle_unknown(check: Callable[..., Any], txn: LocalTransaction) -> TxState:
    """Ask ``check`` until it decides (see :data:`SETTLE_WAITS_S`); UNKNOWN when it never does."""
    for wait in SETTLE_WAITS_S:
        time.sleep(wait)
        try:
            state = coerce_state(check(txn))
        except Exception as exc:  # a failing check leaves it to the back-check, like an UNKNOWN
            logger.warning("own check of %s raised %s", txn.tx_id, type(exc).__name__)
            continue
        if state is TxState.COMMIT or state is TxState.ROLLBACK:
            return state
    return TxState.UNKNOWN


async def settle_unknown_async(check: Callable[..., Any], txn: LocalTransaction) -> TxState:
    """:func:`settle_unknown` for the asyncio producer: a plain check runs in a worker thread."""
    for wait in SETTLE_WAITS_S:
        await asyncio.sleep(wait)
        try:
            if inspect.iscoroutinefunction(check):
                answer = await check(txn)
            else:
                answer = await asyncio.to_thread(check, txn)
                if inspect.isawaitable(answer):
                    answer = await answer
            state = coerce_state(answer)
        except Exception as exc:
            logger.warning("own check of %s raised %s", txn.tx_id, type(exc).__name__)
            continue
        if state is TxState.COMMIT or state is TxState.ROLLBACK:
            return state
    return TxState.UNKNOWN
