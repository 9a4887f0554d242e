"""Keystone detectors: latency regime, heavy-hitter credentials, p95 of small requests.

"RadosGW/Keystone Integration Performance Issues—Finally Solved?" and "Boosting OpenStack's
Parallel Performance" (docs/sources.md): a signed S3 request validated by Keystone takes >= 600 ms, < 10 ms
without; aggressive parallel clients overloaded Keystone and the operators hunted the "problematic"
credentials by hand; the p95 latency of small requests (``body_bytes_sent`` and ``request_length``
both < 65536) fell from ~750 ms to ~100 ms once credentials were cached. A nightly load peak
03:10-04:10 is normal (that is the general detector's seasonal job, see anomaly/model.py).

* ``LatencyRegimeDetector``: two one-sided CUSUMs (Page 1954) on log10(latency): a sustained move
  by more than ``regime_ratio`` (3x) is a regime change; log scale because the regimes differ by a
  factor (~10 ms vs ~600 ms), and a single slow request is not a regime. Finding
  ``keystone.latency_regime`` (warning) while the current regime is ``regime_ratio`` slower than
  the fastest regime seen; cleared when it is fast again, or once the slow regime has held for
  ``REGIME_ACCEPT_S`` (a day, no CUSUM move in it): it is then the norm (a database moved further
  away), the finding clears "accepted as the new norm" and a later move from it opens a new one.
  Before, such a finding stayed open for good, and the move that mattered next (the cache lost:
  ~40 ms -> ~600 ms) was a refresh of it, no new page. A Keystone slow in absolute terms stays
  paged by ``SmallRequestP95Detector``'s limit (the source's 750 ms against 500 ms).
  Input: ``keystone_probe{...}`` field ``latency_ms`` (also ``uwsgi`` access-log ``msecs``).
* ``HeavyHitterDetector``: Space-Saving sketches over a sliding window (see sketches.py); a
  credential with at least ``share`` of the window's validations (and ``min_total`` validations in
  the window) -> ``keystone.heavy_hitter`` (warning), evaluated when a pane closes. Input: one
  event per validation with the credential's *ID* (EC2 access key / user id), never its secret. A round
  that would bring its pane's count past ``MAX_COUNT`` (2^53, what a restore takes) is refused (ValueError),
  as one that would bring the p95 window's past it.
* ``SmallRequestP95Detector``: per tumbling window of ``window_s``, the p95 of requests with both
  sizes below 65536 bytes (LogHistogram, ~1 % error); p95 above ``p95_limit_ms`` (default 500 ms) ->
  ``keystone.small_request_p95`` (warning); every closed window is also returned as a point
  (timestamp, p95) for dashboards. A window with fewer than ``min_requests`` small requests neither raises
  nor clears; ``QUIET_WINDOWS`` such windows in a row clear an open finding ("too little traffic to measure").

Input adapters (``collectors/keystone`` aggregates per round, so the detectors take summaries):
``probe_latency`` reads ``keystone_probe{host, probe}`` (and ``keystone_requests{host, method, endpoint}``)
field ``p50_ms`` (a round's typical latency; ``latency_ms`` / ``msecs`` of a single request too);
``HeavyHitterDetector.update`` takes a ``weight`` (``s3_frontend_credential{host, access_key}`` field
``keystone_validations``; the collector's ``_other`` bucket counts toward the total but is never a
heavy hitter); ``SmallRequestP95Detector.update_summary`` merges a round's count/p50/p95/max of
small requests (``s3_frontend_requests`` fields ``small_requests``, ``small_p50_ms``, ``small_p95_ms``)
into the window: half the requests at p50, 45 % at p95, 5 % at max, so a window of identical rounds
has exactly their p95 and mixed rounds are weighted by their request counts.
"""

from __future__ import annotations

import math
from typing import Any

from opsloop.records import Finding, Severity
from opsloop.records import Metric

from opsloop.streams.detectors.findingbook import FindingBook, where_key
from opsloop.streams.detectors.sketches import LogHistogram, PanedHeavyHitters
from opsloop.streams.detectors.state_check import MAX_COUNT, MAX_EVENT_TIME, event_time, get, items, obj, real
from opsloop.streams.detectors.state_check import count as whole

REGIME = "keystone.latency_regime"
HEAVY = "keystone.heavy_hitter"
SMALL_P95 = "keystone.small_request_p95"
RUNBOOK = "runbooks/keystone.md"
SMALL_LIMIT = 65536
OTHER_CREDENTIALS = "_other"   # the collector's bucket for credentials beyond its top-N
# The latencies the detectors take: a round faster than 1 us is read as 1 us by the handler (MIN_LATENCY_MS
# there is 0.1), one slower than 11.6 days is a corrupt reading (1e308 ms made the regime's ratio inf, and
# a stored level of 1e13 raised at every later round). Their log10, the regime levels a state may hold.
MIN_LATENCY_MS = 1e-3
MAX_LATENCY_MS = 1e9
LOG_MIN, LOG_MAX = math.log10(MIN_LATENCY_MS), math.log10(MAX_LATENCY_MS)
MAX_TOP = 1000        # credentials a heavy-hitter evaluation names
MAX_SERIES = 288      # closed p95 windows kept (a day of 5-minute windows)
# Windows in a row with fewer than min_requests small requests (none at all, between rounds, included) that clear
# an open p95 finding: its p95 can no longer be measured. Not the first one: clients backing off a slow Keystone
# make a dip, and a page cleared and re-opened by it would be a new incident.
QUIET_WINDOWS = 3
# Event-time seconds a slow latency regime must hold, without a CUSUM move, before it is the norm (see the docstring)
REGIME_ACCEPT_S = 86_400.0


class LatencyRegimeDetector:
    def __init__(self, regime_ratio: float = 3.0, threshold: float = 2.0, warmup: int = 5,
                 smoothing: float = 0.05, *, book: FindingBook | None = None) -> None:
        self.regime_ratio = regime_ratio
        self.drift = math.log10(regime_ratio) / 2.0     # CUSUM reference value k: half the shift
        self.threshold = threshold                      # CUSUM decision interval h (log10 units)
        self.warmup = warmup
        self.smoothing = smoothing
        self.n = 0
        self.level = 0.0            # current regime, log10 ms
        self.best = math.inf        # fastest regime seen, log10 ms
        self.up = self.down = 0.0
        self.up_sum = self.down_sum = 0.0
        self.up_n = self.down_n = 0
        self.slow_since: float | None = None   # event time the current slow regime began (None: not slow)
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh

    def update(self, timestamp: float, latency_ms: float, where: dict[str, str] | None = None) -> list[Finding]:
        if not MIN_LATENCY_MS <= latency_ms <= MAX_LATENCY_MS:   # also refuses nan
            raise ValueError(f"latency_ms must be a number from {MIN_LATENCY_MS:g} to {MAX_LATENCY_MS:g} "
                             f"(got {latency_ms!r})")
        y = math.log10(latency_ms)
        self.n += 1
        if self.n <= self.warmup:
            self.level += (y - self.level) / self.n
            if self.n == self.warmup:
                self.best = self.level
            return []
        self.up = max(0.0, self.up + y - self.level - self.drift)
        self.down = max(0.0, self.down + self.level - y - self.drift)
        # Means of the samples since each CUSUM left zero: the new regime's level if it triggers.
        if self.up > 0.0:
            self.up_sum += y
            self.up_n += 1
        else:
            self.up_sum, self.up_n = 0.0, 0
        if self.down > 0.0:
            self.down_sum += y
            self.down_n += 1
        else:
            self.down_sum, self.down_n = 0.0, 0
        if self.up > self.threshold or self.down > self.threshold:
            self.level = self.up_sum / self.up_n if self.up > self.threshold else self.down_sum / self.down_n
            self._reset()
            self.slow_since = None   # a new regime: its own time to become the norm
        else:
            self.level += self.smoothing * max(-self.drift, min(self.drift, y - self.level))
        self.best = min(self.best, self.level)
        return self._finding(timestamp, where or {})

    def _reset(self) -> None:
        self.up = self.down = self.up_sum = self.down_sum = 0.0
        self.up_n = self.down_n = 0

    def _finding(self, now: float, where: dict[str, str]) -> list[Finding]:
        current, best = 10 ** self.level, 10 ** self.best
        if self.level - self.best >= math.log10(self.regime_ratio):
            if self.slow_since is None:
                self.slow_since = now
            if now - self.slow_since >= REGIME_ACCEPT_S:
                self.best, self.slow_since = self.level, None
                done = self.book.clear(REGIME, where, now, (
                    f"~{current:.0f} ms held for {REGIME_ACCEPT_S / 3600:.0f} h: accepted as the new norm (was "
                    f"~{best:.0f} ms); a move from it is a new finding"))
                return [done] if done else []
            ratio = current / best
            return [self.book.raise_(
                detector=REGIME, what="Keystone latency regime changed", where=where,
                observed=round(current, 1), expected=round(best, 1),
                score=min(1.0, math.log10(ratio) / 2.0), severity=Severity.WARNING,
                explanation=(f"typical latency now ~{current:.0f} ms against ~{best:.0f} ms before "
                             f"({ratio:.0f}x): token/credential validation no longer cached, or Keystone "
                             "overloaded"), now=now, runbook=RUNBOOK)]
        self.slow_since = None
        done = self.book.clear(REGIME, where, now, f"latency back to ~{current:.0f} ms")
        return [done] if done else []

    def to_dict(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in ("regime_ratio", "threshold", "warmup", "smoothing", "n", "level",
                                               "up", "down", "up_sum", "down_sum", "up_n", "down_n",
                                               "slow_since")}
        state["best"] = None if math.isinf(self.best) else self.best
        state["book"] = self.book.to_dict()
        return state

    @classmethod
    def from_dict(cls, doc: Any, field: str = "regime") -> "LatencyRegimeDetector":
        """The detector of a :meth:`to_dict` state, every field checked (StateError naming it). Before, a
        damaged one loaded: a level of 1e13 raised OverflowError out of the restore (its gauge), at every
        batch, a string where a number goes TypeError at every round, a negative threshold divided by zero."""
        doc = obj(doc, field)

        def f(name: str, lo: float = -math.inf, hi: float = math.inf, above: bool = False) -> float:
            return real(get(doc, name, field), f"{field}.{name}", lo, hi, above=above)

        det = cls(f("regime_ratio", 1.0, 1e6, above=True), f("threshold", 0.0, 1e6, above=True),
                  whole(get(doc, "warmup", field), f"{field}.warmup", 1), f("smoothing", 0.0, 1.0),
                  book=FindingBook.from_dict(doc.get("book", {}), field=f"{field}.book"))
        det.n = whole(get(doc, "n", field), f"{field}.n")
        # levels are log10 of latencies the detector takes (MIN_LATENCY_MS .. MAX_LATENCY_MS): 10 ** level is a
        # finite, non-zero number of milliseconds; the CUSUMs and their sums stay within what such rounds make
        det.level = f("level", LOG_MIN, LOG_MAX)
        det.best = math.inf if doc.get("best") is None else real(doc["best"], f"{field}.best", LOG_MIN, LOG_MAX)
        span = LOG_MAX - LOG_MIN
        det.up, det.down = f("up", 0.0, det.threshold + span), f("down", 0.0, det.threshold + span)
        det.up_n = whole(get(doc, "up_n", field), f"{field}.up_n")
        det.down_n = whole(get(doc, "down_n", field), f"{field}.down_n")
        det.up_sum = f("up_sum", LOG_MIN * max(1, det.up_n), LOG_MAX * max(1, det.up_n))
        det.down_sum = f("down_sum", LOG_MIN * max(1, det.down_n), LOG_MAX * max(1, det.down_n))
        since = doc.get("slow_since")   # absent: an older state, the slow regime's clock starts anew
        det.slow_since = None if since is None else event_time(since, f"{field}.slow_since")
        return det


class HeavyHitterDetector:
    def __init__(self, share: float = 0.2, min_total: int = 100, window_s: float = 300.0, pane_s: float = 60.0,
                 capacity: int = 64, top: int = 5, *, book: FindingBook | None = None) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1] (got {share})")
        self.share = share
        self.min_total = min_total
        self.top = top
        self.window = PanedHeavyHitters(window_s, pane_s, capacity)
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh

    def update(self, timestamp: float, credential: str, where: dict[str, str] | None = None,
               weight: int = 1) -> list[Finding]:
        """Count ``weight`` validations; findings are (re)evaluated when a pane closes."""
        if not credential:
            raise ValueError("credential id is empty")
        if weight < 0:
            raise ValueError(f"validation count must be >= 0 (got {weight})")
        # A pane's count beyond MAX_COUNT is a state no restore takes (its key started afresh at every restart,
        # its open findings cleared): refused here instead, nothing counted.
        pane = int(timestamp // self.window.pane_s)
        counted = next((s.total for p, s in self.window.panes if p == pane), 0)
        if counted + weight > MAX_COUNT:
            raise ValueError(f"validation count {weight} would bring its pane's to {counted + weight}, beyond the "
                             f"{MAX_COUNT} a stored state holds")
        if self.window.offer(timestamp, credential, weight):
            return self.evaluate(timestamp, where or {})
        return []

    def advance(self, timestamp: float, where: dict[str, str] | None = None) -> bool:
        """A round that counted no validation (none made, or all cached): the window moves on all the same and
        is evaluated when a pane closes (True then; the findings go to the book). Without it the window stood
        still once validations stopped, and a heavy hitter's finding stayed open for good (caching its
        validations, the fix it asks for, did that)."""
        if not self.window.advance(timestamp):
            return False
        self.evaluate(timestamp, where or {})
        return True

    def evaluate(self, now: float, where: dict[str, str]) -> list[Finding]:
        total, ranked = self.window.shares()
        out: list[Finding] = []
        keep: set[str] = set()
        if total >= self.min_total:
            for cred, share, count in [r for r in ranked if r[0] != OTHER_CREDENTIALS][: self.top]:
                if share < self.share:
                    break
                w = {**where, "credential": cred}
                out.append(self.book.raise_(
                    detector=HEAVY, what="credential dominates Keystone validations", where=w,
                    observed=round(share, 3), expected=self.share, score=min(1.0, share / (2 * self.share) + 0.25),
                    severity=Severity.WARNING,
                    explanation=(f"credential {cred} made {count} of {total} validations ({share:.0%}) in the last "
                                 f"{self.window.window_s:.0f} s (limit {self.share:.0%}): cache its validation in "
                                 "RadosGW or throttle the client"), now=now, runbook=RUNBOOK))
                keep.add(where_key(HEAVY, w))
        out += self.book.clear_all_except(HEAVY, keep, now, "share back under the limit", match=where or None)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"share": self.share, "min_total": self.min_total, "top": self.top,
                "window": self.window.to_dict(), "book": self.book.to_dict()}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "heavy") -> "HeavyHitterDetector":
        """The detector of a :meth:`to_dict` state, every field checked (StateError naming it)."""
        doc = obj(doc, field)
        det = cls(share=real(get(doc, "share", field), f"{field}.share", 0.0, 1.0, above=True),
                  min_total=whole(get(doc, "min_total", field), f"{field}.min_total"),
                  top=whole(get(doc, "top", field), f"{field}.top", 0, MAX_TOP),
                  book=FindingBook.from_dict(doc.get("book", {}), field=f"{field}.book"))
        det.window = PanedHeavyHitters.from_dict(get(doc, "window", field), f"{field}.window")
        return det


class SmallRequestP95Detector:
    def __init__(self, window_s: float = 300.0, p95_limit_ms: float = 500.0, min_requests: int = 20, *,
                 book: FindingBook | None = None) -> None:
        self.window_s = window_s
        self.p95_limit_ms = p95_limit_ms
        self.min_requests = min_requests
        self.window_start: float | None = None
        self.hist = LogHistogram()
        self.series: list[tuple[float, float]] = []    # closed windows (start, p95), last 288 kept
        self.quiet = 0   # windows in a row below min_requests, up to QUIET_WINDOWS
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh

    @staticmethod
    def is_small(body_bytes_sent: int, request_length: int) -> bool:
        return body_bytes_sent < SMALL_LIMIT and request_length < SMALL_LIMIT

    def _roll(self, timestamp: float, where: dict[str, str] | None) -> list[Finding]:
        """Start the window ``timestamp`` falls in; closing the previous one yields its findings."""
        start = timestamp - timestamp % self.window_s
        if self.window_start is None:
            self.window_start = start
        elif start > self.window_start:
            # windows between the closed one and this one saw no round at all: quiet ones too
            out = self._close(where or {}, int((start - self.window_start) // self.window_s) - 1)
            self.window_start = start
            return out
        return []

    def update(self, timestamp: float, body_bytes_sent: int, request_length: int, latency_ms: float,
               where: dict[str, str] | None = None) -> list[Finding]:
        out = self._roll(timestamp, where)
        if self.is_small(body_bytes_sent, request_length):
            self.hist.add(latency_ms)
        return out

    def update_summary(self, timestamp: float, count: int, p50_ms: float, p95_ms: float, max_ms: float | None = None,
                       where: dict[str, str] | None = None) -> list[Finding]:
        """Merge one round's summary of ``count`` small requests (see the module docstring). ValueError, nothing
        changed, when the window's count would pass MAX_COUNT (a state no restore takes)."""
        start = timestamp - timestamp % self.window_s
        counted = 0 if self.window_start is not None and start > self.window_start else self.hist.count
        if counted + max(0, count) > MAX_COUNT:
            raise ValueError(f"small request count {count} would bring its window's to {counted + count}, beyond "
                             f"the {MAX_COUNT} a stored state holds")
        out = self._roll(timestamp, where)
        if count <= 0:
            return out
        at_p50 = count // 2
        at_max = count // 20 if max_ms is not None else 0
        self.hist.add(p50_ms, at_p50)
        self.hist.add(p95_ms, count - at_p50 - at_max)
        if at_max:
            self.hist.add(max_ms, at_max)  # type: ignore[arg-type]
        return out

    def _close(self, where: dict[str, str], skipped: int = 0) -> list[Finding]:
        assert self.window_start is not None
        end = self.window_start + self.window_s
        hist, self.hist = self.hist, LogHistogram()
        if hist.count < self.min_requests:
            # Before, such windows left an open finding as it was: a page opened at a daytime peak stayed
            # open all night, about a condition nobody could measure any more.
            self.quiet = min(QUIET_WINDOWS, self.quiet + 1 + max(0, skipped))
            if self.quiet < QUIET_WINDOWS:
                return []
            done = self.book.clear(SMALL_P95, where, end, (
                f"too little traffic to measure: fewer than {self.min_requests} small requests in each of the "
                f"last {QUIET_WINDOWS} windows of {self.window_s:.0f} s"))
            return [done] if done else []
        self.quiet = min(QUIET_WINDOWS, max(0, skipped))
        p95 = hist.quantile(0.95) or 0.0
        self.series.append((self.window_start, p95))
        del self.series[:-MAX_SERIES]
        if p95 > self.p95_limit_ms:
            return [self.book.raise_(
                detector=SMALL_P95, what="p95 latency of small requests is high", where=where,
                observed=round(p95, 1), expected=self.p95_limit_ms,
                score=min(1.0, 0.5 * p95 / self.p95_limit_ms), severity=Severity.WARNING,
                explanation=(f"p95 of {hist.count} small requests (< 64 KiB both ways) was {p95:.0f} ms in the "
                             f"{self.window_s:.0f} s window ending {end:.0f} (limit {self.p95_limit_ms:.0f} ms): "
                             "each request is likely waiting for a Keystone validation"),
                now=end, runbook=RUNBOOK)]
        done = self.book.clear(SMALL_P95, where, end, f"p95 {p95:.0f} ms")
        return [done] if done else []

    def to_dict(self) -> dict[str, Any]:
        return {"window_s": self.window_s, "p95_limit_ms": self.p95_limit_ms, "min_requests": self.min_requests,
                "window_start": self.window_start, "hist": self.hist.to_dict(),
                "series": [list(p) for p in self.series], "quiet": self.quiet, "book": self.book.to_dict()}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "p95") -> "SmallRequestP95Detector":
        """The detector of a :meth:`to_dict` state, every field checked (StateError naming it). Before, a
        damaged one loaded: a window of 0 s raised ZeroDivisionError at every later round, a window start
        that was no number TypeError."""
        doc = obj(doc, field)
        det = cls(real(get(doc, "window_s", field), f"{field}.window_s", 0.0, MAX_EVENT_TIME, above=True),
                  real(get(doc, "p95_limit_ms", field), f"{field}.p95_limit_ms", 0.0, MAX_LATENCY_MS, above=True),
                  whole(get(doc, "min_requests", field), f"{field}.min_requests", 1),
                  book=FindingBook.from_dict(doc.get("book", {}), field=f"{field}.book"))
        start = get(doc, "window_start", field)
        det.window_start = None if start is None else event_time(start, f"{field}.window_start")
        det.hist = LogHistogram.from_dict(get(doc, "hist", field), f"{field}.hist")
        det.quiet = whole(doc.get("quiet", 0), f"{field}.quiet", 0, QUIET_WINDOWS)   # absent: an older state
        for i, point in enumerate(items(get(doc, "series", field), f"{field}.series", MAX_SERIES)):
            where = f"{field}.series[{i}]"
            t, p95 = items(point, where, length=2)
            # a quantile is its bucket's midpoint: up to gamma times the largest latency taken
            det.series.append((event_time(t, f"{where}[0]"), real(p95, f"{where}[1]", 0.0, 2 * MAX_LATENCY_MS)))
        return det


def probe_latency(m: Metric) -> tuple[float, float, dict[str, str]]:
    """(timestamp, latency_ms, where) from a latency sample: field p50_ms (a round), latency_ms or msecs."""
    value = m.fields.get("p50_ms", m.fields.get("latency_ms", m.fields.get("msecs")))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{m.name}: needs a numeric field p50_ms, latency_ms or msecs (got fields {sorted(m.fields)})")
    where = {k: v for k, v in m.tags.items() if k in ("host", "instance", "endpoint", "region", "probe")}
    return m.timestamp, float(value), where
