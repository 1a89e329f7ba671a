"""The public surface of ``txbridge``, pinned: changing it is a deliberate act."""

from __future__ import annotations

import txbridge


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
