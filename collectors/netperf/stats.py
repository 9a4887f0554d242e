"""Summary statistics of a measurement's runs (the source documents report the mean of ten summed runs)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    mean: float
    minimum: float
    maximum: float
    stddev: float  # sample standard deviation (n - 1); 0.0 for a single run


def summarize(values: Sequence[float]) -> Summary | None:
    """None for no values: there is no throughput to report, only failures."""
    if not values:
        return None
    return Summary(n=len(values), mean=statistics.fmean(values), minimum=min(values), maximum=max(values),
                   stddev=statistics.stdev(values) if len(values) > 1 else 0.0)
