"""Where the coordinator's parts report that its clients must be replaced or that it must stop."""

from __future__ import annotations

from dataclasses import dataclass

from txbridge.errors import KafkaOperationError, TxBridgeError


@dataclass
class Failures:
    """Why the clients must be replaced (``clients``: the loop rejoins) or the coordinator
    stop (``fatal``); set by the parts that find out, read by the loop."""

    clients: KafkaOperationError | None = None
    fatal: TxBridgeError | None = None
