"""The public surface of ``txbridge``, pinned: changing it is a deliberate act."""

from __future__ import annotations

import txbridge
import txbridge.aio
import txbridge.producer


def test_all_is_pinned_and_sorted() -> None:
    assert txbridge.__all__ == [
        "AsyncTransactionProducer",
        "AvroSerializer",
        "BytesSerializer",
        "LocalTransaction",
        "Message",
        "ProducerOptions",
        "SqlAlchemyBarrier",
        "SqliteBarrier",
        "StringSerializer",
        "TransactionListener",
        "TransactionProducer",
        "TransactionResult",
        "TxBridgeError",
        "TxState",
        "__version__",
        "decisive",
    ]
    assert txbridge.__all__ == sorted(txbridge.__all__)
    for name in txbridge.__all__:
        assert getattr(txbridge, name) is not None


def test_the_producers_modules_show_the_producers_under_their_public_paths() -> None:
    assert txbridge.producer.__all__ == ["Transaction", "TransactionProducer"]
    assert txbridge.aio.__all__ == ["AsyncTransaction", "AsyncTransactionProducer"]
    assert txbridge.producer.TransactionProducer is txbridge.TransactionProducer
    assert txbridge.aio.AsyncTransactionProducer is txbridge.AsyncTransactionProducer
