"""How big a message is once the coordinator republishes it: one rule for the producer and the coordinator.

The coordinator quarantines a committed message whose republished record is
above its ``max_message_bytes``; the producer refuses the same message before
its half record is written. Both measure it with :func:`record_size`, so they
cannot disagree about where the limit is.
"""

from __future__ import annotations

from collections.abc import Sequence

from txbridge.wire import H_TX

#: The coordinator's ``max_message_bytes`` unless it is configured otherwise (1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024

#: Per-record overhead the broker counts beside key, value and headers (a safe upper bound).
RECORD_OVERHEAD = 64

_TX_HEADER_NAME_BYTES = len(H_TX.encode())


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """The size counted against ``max_message_bytes``: key + value + header names and values + 64.

    Header names count in UTF-8 bytes, as the broker stores them.
    """
    return (
        len(key or b"")
        + len(value or b"")
        + (sum(len(name.encode()) + len(raw or b"") for name, raw in headers) if headers else 0)
        + RECORD_OVERHEAD
    )


def republished_size(
    tx_id: bytes, key: bytes | None, value: bytes | None, user_headers: Sequence[tuple[str, bytes]]
) -> int:
    """:func:`record_size` of a message on its real topic: its user headers plus ``txb.tx``.

    The same number as ``record_size(m.key, m.value, m.republish_headers())`` for the
    :class:`~txbridge.wire.HalfMessage` ``m`` the coordinator decodes (a unit test pins it),
    without building the header list on the producer's hot path.
    """
    return record_size(key, value, user_headers) + _TX_HEADER_NAME_BYTES + len(tx_id)
