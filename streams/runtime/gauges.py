"""Metric children on the stream handlers' hot path: ``labels(...)`` without its checks and lock.

prometheus_client's ``labels()`` validates its arguments, converts every value with ``str()`` and takes
the metric's lock on each call (1-3 µs on the shared cores here); the handlers set a few gauges per
series and batch, ~10^4 calls a batch at fleet scale. :func:`child` first looks the child up in the
metric's own table (prometheus-client 0.26, pinned: ``_metrics``, keyed by the tuple of label values
as strings) and calls ``labels()`` only when it is not there. No cache of ours, so nothing to go
stale: a child removed meanwhile (``remove``, ``clear``, a dropped state key) is created again by
``labels()`` exactly as before, and values that are not strings always take that path.

A tag value becomes a label value only through :func:`label_value`, where the handler reads it into
its state key (so the gauges, their removal and the handler's own state agree on it): a value longer
than :data:`MAX_LABEL_VALUE` characters (a 1 MB host tag went into a label whole, in every scrape) is
shortened to a prefix and a hash of the whole, as the paging stage does for alert labels, so two
values that differ past the cut stay two series; counted in
``opsloop_stream_label_values_shortened_total{handler, tag}``.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import Counter
from prometheus_client.metrics import MetricWrapperBase

from opsloop.labels import MAX_LABEL_VALUE, shorten   # the paging stage's bound and shortening, shared
SHORTENED = Counter("opsloop_stream_label_values_shortened_total",
                    f"Tag values longer than {MAX_LABEL_VALUE} characters shortened to a prefix and a hash "
                    "before they became a metric label", ["handler", "tag"])

M = TypeVar("M", bound=MetricWrapperBase)


def child(metric: M, *values: str) -> M:
    """``metric.labels(*values)``: the existing child straight from the metric's table."""
    got = metric._metrics.get(values)  # type: ignore[attr-defined]
    return got if got is not None else metric.labels(*values)


def bounded_tags(handler: str, tags: dict[str, str]) -> dict[str, str]:
    """``tags`` itself when every key and value fits a label, else a copy with the long ones shortened
    (counted): for a handler that keys its state, findings and table entries by the whole tag set (a
    1 MB tag made a state key and changelog record beyond Kafka's message size)."""
    if all(len(k) <= MAX_LABEL_VALUE and len(v) <= MAX_LABEL_VALUE for k, v in tags.items()):
        return tags
    # the counter names no tag: tag names come from the sample, a label of them would be unbounded too
    return {label_value(handler, "(tag name)", k): label_value(handler, "(tag value)", v) for k, v in tags.items()}


def label_value(handler: str, tag: str, value: str) -> str:
    """``value`` if it fits a label, else its first characters and a hash of the whole (counted).
    Callers on the hot path test ``len(value) > MAX_LABEL_VALUE`` first and call this only then."""
    if len(value) <= MAX_LABEL_VALUE:
        return value
    SHORTENED.labels(handler, tag).inc()
    return shorten(value)
