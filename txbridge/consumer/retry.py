"""The reconsume schedule of the concurrent consumer (RocketMQ's delay levels), pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from txbridge.errors import ConfigurationError

#: RocketMQ's delay levels 3..18, the ones its consumer retries use: 10s 30s 1m 2m ... 1h 2h.
ROCKETMQ_DELAYS_S: tuple[float, ...] = (
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
#: RocketMQ's maxReconsumeTimes for concurrent consumers.
DEFAULT_MAX_RECONSUME = 16
#: Header of a retry record: when it is due, ms since the epoch (the failing consumer's clock).
H_DUE = "txb.due"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how late a failed message is consumed again.

    Attributes:
        delays_s: delay before retry 1, 2, ...; past the end the last delay repeats.
        max_reconsume: retries before the message goes to the dead-letter topic.
    """

    delays_s: Sequence[float] = ROCKETMQ_DELAYS_S
    max_reconsume: int = DEFAULT_MAX_RECONSUME

    def __post_init__(self) -> None:
        if not self.delays_s or any(d < 0 for d in self.delays_s):
            raise ConfigurationError("retry delays must be a non-empty list of seconds >= 0")
        if self.max_reconsume < 0:
            raise ConfigurationError("max_reconsume must be >= 0 (0 sends a failure straight to the DLQ)")
        object.__setattr__(self, "delays_s", tuple(float(d) for d in self.delays_s))

    def delay_for(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry < 1:
            raise ValueError("retry numbers start at 1")
        return self.delays_s[min(retry, len(self.delays_s)) - 1]

    def exhausted(self, retries_done: int) -> bool:
        """True when a message that failed after ``retries_done`` retries goes to the DLQ."""
        return retries_done >= self.max_reconsume

    def due_ms(self, retry: int, now_s: float) -> int:
        """When retry ``retry`` is due, in ms since the epoch (rounded up: never early)."""
        return math.ceil((now_s + self.delay_for(retry)) * 1000)
