"""What the origins' response times say (queue + service, no network), when the telemetry has
them (``Observation.origin_latency_ms``; HAProxy's ``rtime``).

An overloaded origin slows down: its answers show an overload the interval's mean rate may hide
(demand drawn afresh within the interval), and its clients send more once it is relieved. An
origin seen to slow down when overloaded that answered at its unloaded speed all through an
interval was within capacity all through it, whatever a noisy rate reading says. Without
response times every question here answers "not known" (nothing slowed, nothing contradicted).
"""

from __future__ import annotations

from collections import deque

import numpy as np

_EPS = 1e-12


class ResponseTimes:
    """Per origin: the last interval's response times (``now``), the fastest seen (``base``: its
    unloaded speed, 0 until it answered), the slowest seen in an interval read over capacity, and
    the jitter of its answers at low load."""

    def __init__(self, n_origins: int) -> None:
        self.n_origins = n_origins
        self.now: np.ndarray | None = None
        self.base: np.ndarray | None = None
        # the slowest answer seen in an interval measured over capacity (does this origin's
        # response time show its overload?)
        self._over = np.zeros(n_origins)
        self._jitter: list[deque[float]] = [deque(maxlen=20) for _ in range(n_origins)]

    def observe(self, origin_latency_ms: np.ndarray | None) -> None:
        """Take the last interval's response times (None: the telemetry has none)."""
        if origin_latency_ms is None:
            self.now = self.base = None
            return
        now = np.clip(np.nan_to_num(np.asarray(origin_latency_ms, dtype=float)), 0.0, None)
        self.now = now
        # the fastest answer seen, 0 until one is: a 0 ms reading (an HAProxy server that never
        # answered reads rtime 0; so does one within the network latency configured) tells no
        # unloaded speed, and kept as one every later answer read as slowed by overload
        base = now if self.base is None else self.base
        self.base = np.where(base > 0, np.minimum(base, np.where(now > 0, now, base)), now)

    def slowed(self, margin: float | np.ndarray, answers: np.ndarray | None = None) -> np.ndarray:
        """[O]: origins whose ``answers`` (default: the last interval's response times) were
        more than ``margin`` slower than their fastest answer seen (none of them without
        response times, or before an origin answered at all: no unloaded speed to compare)."""
        if self.now is None:
            return np.zeros(self.n_origins, dtype=bool)
        answers = self.now if answers is None else answers
        return (self.base > 0) & (answers > self.base * (1 + margin) + 1e-9)

    def note_over(self, over: np.ndarray) -> None:
        """The origins ``over`` were read over capacity in the last interval: how slow they
        answered is how their overload shows."""
        self._over = np.where(over, np.maximum(self._over, self.now), self._over)

    def answered_unloaded(self) -> np.ndarray:
        """[O]: origins seen to slow down when overloaded that answered at their unloaded speed
        all through the last interval (so were within capacity all through it)."""
        shows_overload = self.slowed(0.01, self._over)
        return shows_overload & ~self.slowed(1e-4)  # any overload in the interval slows it

    def jitter(self, quiet: np.ndarray) -> np.ndarray:
        """[O] the most an origin's answers were seen slower than unloaded while it was
        ``quiet`` (lightly loaded): its own jitter, which no overload explains. The last
        interval counts for the ``quiet`` ones."""
        slower = self.now / np.maximum(self.base, _EPS) - 1.0
        for o in np.flatnonzero(quiet):
            self._jitter[o].append(float(slower[o]))
        return np.array([max(j, default=0.0) for j in self._jitter])

    def at_loads(self, last: np.ndarray, planned: np.ndarray) -> np.ndarray | None:
        """[O] response times at ``planned`` loads (fractions of capacity) for the origins
        relieved from a deeper overload than the ``last`` one they carried (more than 5 % over
        capacity and slowed): from their unloaded speed at capacity to the speed read at the last
        load, linear in between (two points read, no queueing model assumed); every other origin
        as it answers now. ``None`` if none is (or without response times). No slope is carried
        to an origin loaded further: read off another origin, such an extrapolation swung a
        small origin's share every interval (``bench.sim_kinds`` 11 #4)."""
        if self.now is None:
            return None
        read = (last > 1.05) & self.slowed(0.0) & (planned < last)
        if not read.any():
            return None
        part = np.clip((planned - 1.0) / np.maximum(last - 1.0, _EPS), 0.0, 1.0)
        return np.where(read, self.base + (self.now - self.base) * part, self.now)
