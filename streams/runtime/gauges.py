"""Metric children on the stream handlers' hot path: ``labels(...)`` without its checks and lock.

prometheus_client's ``labels()`` validates its arguments, converts every value with ``str()`` and takes
the metric's lock on each call (1-3 µs on the shared cores here); the handlers set a few gauges per
series and batch, ~10^4 calls a batch at fleet scale. :func:`child` first looks the child up in the
metric's own table (prometheus-client 0.26, pinned: ``_metrics``, keyed by the tuple of label values
as strings) and calls ``labels()`` only when it is not there. No cache of ours, so nothing to go
stale: a child removed meanwhile (``remove``, ``clear``, a dropped state key) is created again by
``labels()`` exactly as before, and values that are not strings always take that path.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


def child(metric: M, *values: str) -> M:
    """``metric.labels(*values)``: the existing child straight from the metric's table."""
    got = metric._metrics.get(values)  # type: ignore[attr-defined]
    return got if got is not None else metric.labels(*values)
