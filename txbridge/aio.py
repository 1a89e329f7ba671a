"""The asyncio transactional producer (:mod:`txbridge.producer.asyncio`), under its public name.

The same protocol as :class:`~txbridge.producer.TransactionProducer`, awaited instead of
blocked on: ``async with AsyncTransactionProducer(...) as producer``.
"""

from __future__ import annotations

from txbridge.producer.asyncio import AsyncTransaction, AsyncTransactionProducer

__all__ = ["AsyncTransaction", "AsyncTransactionProducer"]
