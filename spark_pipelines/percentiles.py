"""The percentile every figure of the demo's report uses (the table's and the latency split's)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[int], q: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least ``q`` of the samples at or below it)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(round(q * len(sorted_values), 9)))  # round: 0.99 * 100 is 99.00000000000001
    return float(sorted_values[min(rank, len(sorted_values)) - 1])
