"""Latency summaries (count, p50, p95, max) over one round's observations, in milliseconds."""

from __future__ import annotations

import math
from typing import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending, non-empty sequence.

    Nearest rank, not interpolation: the result is always a latency that was observed, which is
    what an operator expects when reading "p95 = 750 ms" off a log.
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r} is outside 0..100")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarize(values_ms: Sequence[float]) -> dict[str, float]:
    """Fields for a latency sample; empty dict when there was nothing to measure."""
    if not values_ms:
        return {}
    ordered = sorted(values_ms)
    return {
        "count": float(len(ordered)),
        "p50_ms": percentile(ordered, 50),
        "p95_ms": percentile(ordered, 95),
        "max_ms": float(ordered[-1]),
    }
