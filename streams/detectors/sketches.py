"""Bounded-memory stream summaries with JSON-able state.

* ``SpaceSaving`` (Metwally, Agrawal, El Abbadi 2005): top-k frequent items with ``capacity``
  counters. Every item whose true count exceeds total/capacity is kept; a kept item's count
  overestimates the truth by at most its recorded error.
* ``PanedHeavyHitters``: a sliding window made of tumbling panes, one Space-Saving sketch each, so
  memory is ``panes x capacity`` counters whatever the number of distinct credentials.
* ``LogHistogram``: quantiles with bounded relative error (logarithmic buckets as in DDSketch,
  Masson et al. 2019): a value v lands in bucket ceil(log(v)/log(gamma)); with gamma = 1.02 any
  quantile is within ~1 % of the true value.
"""

from __future__ import annotations

import math
from typing import Any, Hashable

from opsloop.streams.detectors.state_check import MAX_EVENT_TIME, StateError, count, get, items, obj, real

# Bounds of a stored sketch (a larger one is a damaged state): counters per sketch, panes per window,
# the histogram's bucket growth, and the log of the largest value a bucket bound may reach.
MAX_CAPACITY = 1_000_000
MAX_PANES = 100_000
MAX_GAMMA = 2.0
MAX_LOG_VALUE = 709.0


class SpaceSaving:
    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f"Space-Saving capacity must be >= 1 (got {capacity})")
        self.capacity = capacity
        self.counts: dict[str, list[int]] = {}   # item -> [count, overestimation bound]
        self.total = 0

    def offer(self, item: str, weight: int = 1) -> None:
        self.total += weight
        c = self.counts.get(item)
        if c is not None:
            c[0] += weight
            return
        if len(self.counts) < self.capacity:
            self.counts[item] = [weight, 0]
            return
        # Replace the item with the smallest count; the newcomer inherits it as its error bound.
        victim = min(self.counts, key=lambda k: self.counts[k][0])
        floor = self.counts.pop(victim)[0]
        self.counts[item] = [floor + weight, floor]

    def top(self, n: int | None = None) -> list[tuple[str, int, int]]:
        ranked = sorted(((k, c, e) for k, (c, e) in self.counts.items()), key=lambda r: (-r[1], r[0]))
        return ranked if n is None else ranked[:n]

    def to_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "counts": self.counts, "total": self.total}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "sketch") -> "SpaceSaving":
        """The sketch of a :meth:`to_dict` state, every field checked (StateError naming it): counts whole and
        >= 0, each error bound within its count, no more items than the capacity, and a total no smaller than
        the counts it holds (else a share came out above 1 or below 0)."""
        doc = obj(doc, field)
        s = cls(count(get(doc, "capacity", field), f"{field}.capacity", 1, MAX_CAPACITY))
        counts = obj(get(doc, "counts", field), f"{field}.counts")
        if len(counts) > s.capacity:
            raise StateError(f"{field}.counts", f"{len(counts)} items, more than its capacity {s.capacity}")
        for k, v in counts.items():
            where = f"{field}.counts[{k!r}]"
            c, e = items(v, where, length=2)
            c = count(c, f"{where}[0]")
            s.counts[k] = [c, count(e, f"{where}[1]", 0, c)]
        s.total = count(get(doc, "total", field), f"{field}.total")
        if s.total < sum(c - e for c, e in s.counts.values()):
            raise StateError(f"{field}.total", f"{s.total} is less than the counts it holds")
        return s


class PanedHeavyHitters:
    """Heavy hitters over the last ``window_s`` seconds, in panes of ``pane_s`` seconds."""

    def __init__(self, window_s: float = 300.0, pane_s: float = 60.0, capacity: int = 64) -> None:
        if pane_s <= 0 or window_s < pane_s:
            raise ValueError(f"need 0 < pane_s <= window_s (got pane_s={pane_s}, window_s={window_s})")
        self.window_s = window_s
        self.pane_s = pane_s
        self.capacity = capacity
        self.panes: list[tuple[int, SpaceSaving]] = []   # (pane number, sketch), oldest first

    def offer(self, timestamp: float, item: Hashable, weight: int = 1) -> bool:
        """Count one event; True when it opened a new pane (a good moment to evaluate)."""
        pane = int(timestamp // self.pane_s)
        rolled = self._advance(pane)
        target = next((s for p, s in reversed(self.panes) if p == pane), None)
        if target is None:       # older than the window, or a pane already gone: too late to count
            return rolled
        target.offer(str(item), weight)
        return rolled

    def advance(self, timestamp: float) -> bool:
        """Let time pass without an event (a round with nothing to count): True when it opened a new pane. The
        panes it passes expire, so a window whose events stopped empties instead of holding its last counts."""
        return self._advance(int(timestamp // self.pane_s))

    def _advance(self, pane: int) -> bool:
        rolled = False
        if not self.panes or pane > self.panes[-1][0]:
            self.panes.append((pane, SpaceSaving(self.capacity)))
            rolled = len(self.panes) > 1
        self._expire(pane)
        return rolled

    def _expire(self, newest: int) -> None:
        keep = int(math.ceil(self.window_s / self.pane_s))
        self.panes = [(p, s) for p, s in self.panes if p > newest - keep]

    def shares(self) -> tuple[int, list[tuple[str, float, int]]]:
        """(total events in the window, [(item, share, count)] by count, largest first)."""
        total = sum(s.total for _, s in self.panes)
        merged: dict[str, int] = {}
        for _, s in self.panes:
            for k, (c, e) in s.counts.items():
                merged[k] = merged.get(k, 0) + c - e       # guaranteed (lower-bound) count
        ranked = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))
        return total, [(k, (c / total if total else 0.0), c) for k, c in ranked]

    def to_dict(self) -> dict[str, Any]:
        return {"window_s": self.window_s, "pane_s": self.pane_s, "capacity": self.capacity,
                "panes": [[p, s.to_dict()] for p, s in self.panes]}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "window") -> "PanedHeavyHitters":
        """The window of a :meth:`to_dict` state, every field checked (StateError naming it): panes in order,
        numbered as event times divide into them, no more than the window holds."""
        doc = obj(doc, field)
        pane_s = real(get(doc, "pane_s", field), f"{field}.pane_s", 0.0, MAX_EVENT_TIME, above=True)
        window_s = real(get(doc, "window_s", field), f"{field}.window_s", pane_s, pane_s * MAX_PANES)
        h = cls(window_s, pane_s, count(get(doc, "capacity", field), f"{field}.capacity", 1, MAX_CAPACITY))
        last = -1
        for i, entry in enumerate(items(get(doc, "panes", field), f"{field}.panes",
                                        int(math.ceil(window_s / pane_s)) + 1)):
            where = f"{field}.panes[{i}]"
            p, sketch = items(entry, where, length=2)
            p = count(p, f"{where}[0]", last + 1, int(MAX_EVENT_TIME // pane_s) + 1)
            h.panes.append((p, SpaceSaving.from_dict(sketch, f"{where}[1]")))
            last = p
        return h


class LogHistogram:
    def __init__(self, gamma: float = 1.02) -> None:
        if gamma <= 1.0:
            raise ValueError(f"histogram gamma must be > 1 (got {gamma})")
        self.gamma = gamma
        self._log_gamma = math.log(gamma)
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.count = 0

    def add(self, value: float, weight: int = 1) -> None:
        """Count ``value`` ``weight`` times (a weight lets a pre-aggregated summary be merged)."""
        if weight <= 0:
            return
        self.count += weight
        if value <= 0.0:
            self.zeros += weight
            return
        i = math.ceil(math.log(value) / self._log_gamma)
        self.buckets[i] = self.buckets.get(i, 0) + weight

    def quantile(self, q: float) -> float | None:
        if not self.count:
            return None
        rank = q * (self.count - 1)
        seen = self.zeros
        if rank < seen:
            return 0.0
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen > rank:
                # Bucket i holds (gamma^(i-1), gamma^i]; its midpoint in relative terms.
                return 2.0 * self.gamma ** i / (self.gamma + 1.0)
        return self.gamma ** max(self.buckets)

    def to_dict(self) -> dict[str, Any]:
        return {"gamma": self.gamma, "buckets": {str(k): v for k, v in self.buckets.items()},
                "zeros": self.zeros, "count": self.count}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "hist") -> "LogHistogram":
        """The histogram of a :meth:`to_dict` state, every field checked (StateError naming it): buckets whose
        bounds are finite floats (a larger index raised OverflowError at every quantile), whole counts that
        add up to ``count`` (a count above them read past the last bucket, ``max()`` of none raised)."""
        doc = obj(doc, field)
        h = cls(real(get(doc, "gamma", field), f"{field}.gamma", 1.0, MAX_GAMMA, above=True))
        top = int(MAX_LOG_VALUE / h._log_gamma)   # gamma ** top is still a finite float
        for k, v in obj(get(doc, "buckets", field), f"{field}.buckets").items():
            where = f"{field}.buckets[{k!r}]"
            try:
                i = int(k)
            except ValueError:
                raise StateError(where, "not a bucket index") from None
            if not -top <= i <= top:
                raise StateError(where, f"bucket index beyond a float's range (at most {top})")
            h.buckets[i] = count(v, where, 1)
        h.zeros = count(get(doc, "zeros", field), f"{field}.zeros")
        h.count = count(get(doc, "count", field), f"{field}.count")
        if h.count != h.zeros + sum(h.buckets.values()):
            raise StateError(f"{field}.count", f"{h.count} is not the {h.zeros + sum(h.buckets.values())} "
                                               "values its buckets hold")
        return h
