"""The transactional producers: blocking here, asyncio in :mod:`txbridge.aio`.

Where each part lives:

- :mod:`~txbridge.producer.transaction`: ``ProducerTransaction``, one transaction's whole
  state (phase table, messages, partition, records in flight); it writes, never waits.
- :mod:`~txbridge.producer.blocking`: :class:`TransactionProducer` and :class:`Transaction`,
  which wait on futures.
- :mod:`~txbridge.producer.asyncio`: :class:`~txbridge.aio.AsyncTransactionProducer` and
  :class:`~txbridge.aio.AsyncTransaction`, which await acknowledgements on the event loop.
- :mod:`~txbridge.producer.runtime`: what a producer instance runs on (check server, heartbeat,
  the shared Kafka producer, topic listings, start and close).
- :mod:`~txbridge.producer.settings`, :mod:`~txbridge.producer.catalog`,
  :mod:`~txbridge.producer.records`, :mod:`~txbridge.producer.outcome`: the options, the topic
  listing, the half and op record encoder, and the rules that decide an outcome.
"""

from __future__ import annotations

from txbridge.producer.blocking import Transaction, TransactionProducer

__all__ = ["Transaction", "TransactionProducer"]
