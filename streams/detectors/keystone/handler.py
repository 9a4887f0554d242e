"""Keystone agent: ``telemetry.keystone`` -> latency regime, heavy-hitter credentials, p95 of small requests.

Per Keystone host (the state key) it runs the three detectors of ``opsloop.streams.detectors.keystone.detector`` on
what ``collectors/keystone`` publishes per round:

* ``keystone_probe{host, probe}`` p50_ms and ``keystone_requests{host, method, endpoint}`` p50_ms (for
  the validation endpoints, rounds with at least ``regime_min_count`` requests) -> one
  ``LatencyRegimeDetector`` per source (``probe:<name>`` / ``<METHOD> <endpoint>``);
* ``s3_frontend_credential{host, access_key}`` keystone_validations -> ``HeavyHitterDetector`` (its window
  moves on with every ``s3_frontend_*`` round, validations or none, so a heavy hitter cached away clears);
* ``s3_frontend_requests{host}`` small_requests/small_p50_ms/small_p95_ms -> ``SmallRequestP95Detector``.

Gauges: ``opsloop_keystone_small_request_p95_seconds{host}`` (the last round, as measured; no sample after a
round without small requests), ``opsloop_keystone_small_request_p95_window_seconds{host}`` (the detector's last
closed window; no sample when it had fewer than ``p95_min_requests`` small requests),
``opsloop_keystone_latency_regime_seconds{host, source}`` (the current regime's typical latency),
``opsloop_keystone_credential_share{host, credential}`` (top credentials' share of validations over
the sliding window; access key *ids*, never secrets) and ``opsloop_keystone_window_validations{host}``.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from prometheus_client import Counter, Gauge

from opsloop.labels import label_string
from opsloop.log import Sampled
from opsloop.records import Metric
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler, drop_children, log, number
from opsloop.streams.detectors.keystone.settings import KeystoneSettings
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.sketches import PanedHeavyHitters
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, label_value
from opsloop.streams.detectors.keystone.detector import (MAX_LATENCY_MS, OTHER_CREDENTIALS, HeavyHitterDetector,
                                                         LatencyRegimeDetector, SmallRequestP95Detector, probe_latency)
from opsloop.streams.detectors.state_check import event_time, get, obj

P95_ROUND = Gauge("opsloop_keystone_small_request_p95_seconds", "p95 latency of small requests in the last round",
                  ["host"])
P95_WINDOW = Gauge("opsloop_keystone_small_request_p95_window_seconds",
                   "p95 latency of small requests over the detector's last closed window", ["host"])
REGIME = Gauge("opsloop_keystone_latency_regime_seconds", "Typical latency of the current regime",
               ["host", "source"])
SHARE = Gauge("opsloop_keystone_credential_share", "Share of Keystone validations over the sliding window",
              ["host", "credential"])
WINDOW_TOTAL = Gauge("opsloop_keystone_window_validations", "Keystone validations in the sliding window", ["host"])
GUARD_DROPPED = Counter("opsloop_keystone_replay_guard_dropped_total",
                        "Series whose last round a host's replay guard forgot past its cap, still in the window")

VALIDATION_ENDPOINTS = ("/v3/auth/tokens", "/v3/s3tokens", "/v3/ec2tokens")
MIN_LATENCY_MS = 0.1   # a 0 ms round (sub-millisecond log resolution) is fast, not missing
SHOWN_CREDENTIALS = 5
# The largest count one round may report (requests, validations): beyond it a corrupt reading, whose sums
# JSON cannot carry (an int of 1e300 made the host's state unwritable) and no restore would take.
MAX_ROUND_COUNT = 1e12
S_PER_MS = 1e-3   # the wire carries milliseconds (collector fields *_ms); Prometheus gets seconds
# The replay guard (series -> last round's event time) is part of the host's state, one Kafka record of the
# changelog: kept bounded, else rotating access keys (one series each) grew it past the producer's 1 MB and
# the record crashed the worker. A credential series goes once its last round is older than the heavy-hitter
# window (a replay of it is not counted anyway), any other after an hour of the host's rounds without it;
# past the cap, the oldest go (counted). A series key is at most MAX_SERIES_KEY printable ASCII characters.
CREDENTIAL_SERIES = "s3_frontend_credential|"
REPLAY_HORIZON_S = 3600.0
MAX_GUARDED_SERIES = 2048
MAX_SERIES_KEY = 160
GUARD_LOG = Sampled(60.0)


@dataclass(slots=True)
class HostState:
    regimes: dict[str, LatencyRegimeDetector]
    heavy: HeavyHitterDetector
    p95: SmallRequestP95Detector
    last_ts: dict[str, float] = field(default_factory=dict)   # input series -> last round's event time

    def books(self) -> list[FindingBook]:
        return [*(d.book for d in self.regimes.values()), self.heavy.book, self.p95.book]

    def to_dict(self) -> dict[str, Any]:
        return {"regimes": {k: d.to_dict() for k, d in self.regimes.items()}, "heavy": self.heavy.to_dict(),
                "p95": self.p95.to_dict(), "last_ts": dict(self.last_ts)}


class KeystoneHandler(DetectorHandler):
    name = "keystone-detector"
    topics = (Topic.KEYSTONE,)
    names = frozenset(("keystone_probe", "keystone_requests", "s3_frontend_credential", "s3_frontend_requests"))

    def __init__(self, settings: KeystoneSettings | None = None, refresh_s: float = 300.0) -> None:
        super().__init__()
        self.settings = settings or KeystoneSettings()
        self.refresh_s = refresh_s
        self.hosts: dict[str, HostState] = {}
        self._shown_credentials: dict[str, set[str]] = {}

    def _host(self, host: str) -> HostState:
        st = self.hosts.get(host)
        if st is None:
            s = self.settings
            st = HostState({}, HeavyHitterDetector(share=s.heavy_share, min_total=s.heavy_min_total,
                                                   window_s=s.heavy_window_s, pane_s=s.heavy_pane_s,
                                                   book=FindingBook(self.refresh_s)),
                           SmallRequestP95Detector(s.p95_window_s, s.p95_limit_ms, s.p95_min_requests,
                                                   book=FindingBook(self.refresh_s)))
            self.hosts[host] = st
        return st

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        shares_changed: set[str] = set()
        frontend_rounds: dict[str, float] = {}   # host -> newest s3_frontend_* round read: the heavy window's time
        guarded: set[str] = set()   # hosts whose replay guard took a series
        for m in metrics:
            host = m.tags.get("host")
            if not host or m.name not in self.names:
                continue
            if len(host) > MAX_LABEL_VALUE:   # a label value: bounded before it keys any state
                host = label_value(self.name, "host", host)
            series = series_key(m)
            known = self.hosts.get(host)
            if known is not None and self.is_replay(m.timestamp, known.last_ts.get(series)):
                continue   # replayed after a crash: already counted
            st = known if known is not None else self._host(host)
            try:
                if m.name == "s3_frontend_credential":
                    self._credential(host, st, m)
                    shares_changed.add(host)
                elif m.name == "s3_frontend_requests":
                    self._small_requests(host, st, m)
                else:
                    self._latency(host, st, m)
            except ValueError as e:
                if known is None:
                    # made for this sample alone: never touched, so never written nor dropped by the TTL
                    # or the cap (a poison stream of host names kept one each)
                    del self.hosts[host]
                self.reject("keystone_sample_rejected", m, str(e), metric=m.name)
                continue
            st.last_ts[series] = m.timestamp
            guarded.add(host)
            self.touch(host)
            if m.name.startswith("s3_frontend_"):
                frontend_rounds[host] = max(m.timestamp, frontend_rounds.get(host, m.timestamp))
        # After the batch's counts: a round that counted validations has opened its pane (and evaluated) already;
        # one that counted none (every validation cached, no signed request) moves the window on here
        for host, ts in frontend_rounds.items():
            if self.hosts[host].heavy.advance(ts, {"host": host}):
                shares_changed.add(host)   # panes expired: the shares shown change
        for host in shares_changed:
            self._show_shares(host, self.hosts[host])
        for host in guarded:   # after the window moved on: what it no longer counts needs no guard
            self._bound_guard(host, self.hosts[host])

    def _bound_guard(self, host: str, st: HostState) -> None:
        """Forget the series a replay can no longer double-count (see CREDENTIAL_SERIES); then, past
        MAX_GUARDED_SERIES, the oldest (counted, logged): a replay of those after a crash may count once more."""
        guard = st.last_ts
        if not guard:
            return
        horizon = max(guard.values()) - max(REPLAY_HORIZON_S, st.heavy.window.window_s, st.p95.window_s)
        panes = st.heavy.window.panes
        # a replayed round of a pane before the window's oldest is not counted (PanedHeavyHitters.offer)
        oldest = panes[0][0] if panes else None
        pane_s = st.heavy.window.pane_s
        stale = [s for s, t in guard.items() if t < horizon or (
            oldest is not None and s.startswith(CREDENTIAL_SERIES) and int(t // pane_s) < oldest)]
        for s in stale:
            del guard[s]
        over = len(guard) - MAX_GUARDED_SERIES
        if over > 0:
            for s in heapq.nsmallest(over, guard, key=guard.__getitem__):
                del guard[s]
            GUARD_DROPPED.inc(over)
            GUARD_LOG.warning(log, "keystone_replay_guard_full", key=host, handler=self.name, host=host,
                              dropped=over, kept=MAX_GUARDED_SERIES,
                              why="more series in the heavy-hitter window than the guard keeps (a scanner "
                                  "trying access keys?): a replay of the oldest after a crash may count again")

    def _latency(self, host: str, st: HostState, m: Metric) -> None:
        count = number(m.fields, "count")
        if m.name == "keystone_probe":
            if count == 0 or "p50_ms" not in m.fields:
                return   # every probe failed this round: keystone_probe_errors says why
            source = "probe:" + m.tags.get("probe", "")
        else:
            endpoint = m.tags.get("endpoint", "")
            if endpoint not in VALIDATION_ENDPOINTS or (count or 0) < self.settings.regime_min_count:
                return
            source = f"{m.tags.get('method', '')} {endpoint}"
        if len(source) > MAX_LABEL_VALUE:
            source = label_value(self.name, "source", source)
        ts, latency, _ = probe_latency(m)
        det = st.regimes.get(source)
        if det is None:
            det = st.regimes[source] = LatencyRegimeDetector(regime_ratio=self.settings.regime_ratio,
                                                             book=FindingBook(self.refresh_s))
        det.update(ts, max(MIN_LATENCY_MS, latency), {"host": host, "source": source})
        if det.n >= det.warmup:
            REGIME.labels(host, source).set(10 ** det.level * S_PER_MS)

    def _credential(self, host: str, st: HostState, m: Metric) -> None:
        key = m.tags.get("access_key", "")
        if len(key) > MAX_LABEL_VALUE:   # shown as a label of the credential share
            key = label_value(self.name, "access_key", key)
        validations = number(m.fields, "keystone_validations")
        if not key or validations is None:
            raise ValueError(f"s3_frontend_credential needs an access_key tag and a numeric keystone_validations "
                             f"field (got tags {sorted(m.tags)}, fields {sorted(m.fields)})")
        if validations > MAX_ROUND_COUNT:
            raise ValueError(f"s3_frontend_credential: keystone_validations {validations:g} is not a round's count "
                             f"(at most {MAX_ROUND_COUNT:g})")
        if validations > 0:
            st.heavy.update(m.timestamp, key, {"host": host}, weight=int(validations))

    def _small_requests(self, host: str, st: HostState, m: Metric) -> None:
        count = number(m.fields, "small_requests") or 0.0
        p50, p95 = number(m.fields, "small_p50_ms"), number(m.fields, "small_p95_ms")
        if count > MAX_ROUND_COUNT or any(v is not None and v > MAX_LATENCY_MS
                                          for v in (p50, p95, number(m.fields, "max_ms"))):
            raise ValueError(f"s3_frontend_requests: a count above {MAX_ROUND_COUNT:g} or a latency above "
                             f"{MAX_LATENCY_MS:g} ms is no round's (fields {dict(m.fields)!r:.200})")
        if count > 0 and p50 is not None and p95 is not None:
            st.p95.update_summary(m.timestamp, int(count), p50, p95, number(m.fields, "max_ms"), {"host": host})
            P95_ROUND.labels(host).set(p95 * S_PER_MS)   # once taken (ValueError: refused, nothing shown)
        else:
            st.p95.update_summary(m.timestamp, 0, 0.0, 0.0, None, {"host": host})
            # A quiet round measured nothing: no sample (before, the last busy round's p95 stayed for good, a
            # page's 750 ms all night or a healthy 100 ms through an outage; 0 would read fast, NaN breaks rules)
            _drop(P95_ROUND, host)
        _show_window(host, st.p95)

    def _show_shares(self, host: str, st: HostState) -> None:
        total, ranked = st.heavy.window.shares()
        WINDOW_TOTAL.labels(host).set(total)
        top = {c: share for c, share, _ in ranked if c != OTHER_CREDENTIALS}
        shown = set(list(top)[:SHOWN_CREDENTIALS])
        for c in self._shown_credentials.get(host, set()) - shown:
            try:
                SHARE.remove(host, c)
            except KeyError:
                pass
        for c in shown:
            SHARE.labels(host, c).set(top[c])
        self._shown_credentials[host] = shown

    # --------------------------------------------------------------------------- state
    def forget(self, keys: set[str]) -> None:
        for key in keys:
            self.hosts.pop(key, None)
            self._shown_credentials.pop(key, None)
        for gauge in (P95_ROUND, P95_WINDOW, REGIME, SHARE, WINDOW_TOTAL):
            drop_children(gauge, "host", keys)

    def books(self) -> Iterable[FindingBook]:
        return [b for st in self.hosts.values() for b in st.books()]

    def state_of(self, key: str) -> dict[str, Any] | None:
        st = self.hosts.get(key)
        return st.to_dict() if st else None

    def reset(self) -> None:
        self.hosts = {}

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        regimes = {k: LatencyRegimeDetector.from_dict(v, f"regimes[{k!r}]")
                   for k, v in obj(get(state, "regimes", ""), "regimes").items()}
        stored = {k: event_time(v, f"last_ts[{k!r}]") for k, v in obj(state.get("last_ts", {}), "last_ts").items()}
        st = HostState(regimes, HeavyHitterDetector.from_dict(get(state, "heavy", "")),
                       SmallRequestP95Detector.from_dict(get(state, "p95", "")),
                       {k: t for k, v in stored.items()
                        if (t := self.trusted_time(v, f"last round of {k}")) is not None})
        for book in st.books():
            book.check_about({"host": key}, "book")
            book.refresh_s = self.refresh_s
        self._configure(st)
        self._bound_guard(key, st)   # a state written before the bound (or with other settings)
        self.hosts[key] = st

    def _configure(self, st: HostState) -> None:
        """The knobs configured now on a restored host, not the stored ones: before, a ``p95_limit_ms`` or a
        ``heavy_share`` raised by the operator (say, to stop a false page) never applied to a host already
        watched. The learned state is kept; heavy-hitter panes of another size cannot be, they count afresh."""
        s = self.settings
        for det in st.regimes.values():
            det.regime_ratio, det.drift = s.regime_ratio, math.log10(s.regime_ratio) / 2.0
        st.heavy.share, st.heavy.min_total = s.heavy_share, s.heavy_min_total
        window = st.heavy.window
        if (window.window_s, window.pane_s) != (s.heavy_window_s, s.heavy_pane_s):
            st.heavy.window = PanedHeavyHitters(s.heavy_window_s, s.heavy_pane_s, window.capacity)
        st.p95.window_s, st.p95.p95_limit_ms, st.p95.min_requests = s.p95_window_s, s.p95_limit_ms, s.p95_min_requests

    def after_restore(self) -> None:
        for host, st in self.hosts.items():
            for source, det in st.regimes.items():
                if det.n >= det.warmup:
                    REGIME.labels(host, source).set(10 ** det.level * S_PER_MS)
            _show_window(host, st.p95)
            self._show_shares(host, st)


def _drop(gauge: Gauge, host: str) -> None:
    try:
        gauge.remove(host)
    except KeyError:
        pass


def _show_window(host: str, det: SmallRequestP95Detector) -> None:
    """The p95 of the last window that ended, if it was measured; no sample when it had fewer than
    ``p95_min_requests`` small requests (or saw no round): a quiet window reads as quiet, not as the last
    busy one (which it did until traffic came back)."""
    last = det.series[-1] if det.series else None
    if (last is not None and det.window_start is not None
            and abs(det.window_start - det.window_s - last[0]) < det.window_s / 2):   # the window before
        P95_WINDOW.labels(host).set(last[1] * S_PER_MS)
    else:
        _drop(P95_WINDOW, host)


def series_key(m: Metric) -> str:
    """The replay guard's key of ``m``'s series: name and tags but the host, or, when that is longer than
    MAX_SERIES_KEY or not printable ASCII, the name and a hash of it (a tag of 700 kB made a key that long)."""
    series = m.name + "|" + label_string(m.tags, skip=("host",))
    if len(series) <= MAX_SERIES_KEY and series.isascii() and series.isprintable():
        return series
    return m.name + "|#" + hashlib.sha1(series.encode("utf-8", "surrogatepass")).hexdigest()
