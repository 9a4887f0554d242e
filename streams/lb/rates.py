"""Per-backend and per-server request rates from load-balancer counters.

Input samples (our HAProxy collector and Telegraf's ``inputs.haproxy`` write the same shape):
``haproxy`` with tags ``host`` (the load balancer), ``proxy``, ``sv``, ``type``
(frontend/backend/server) and the ``show stat`` counters as fields. The request count of a row is
the sum of its HTTP response counters (``hrsp_1xx`` … ``hrsp_other``) when present — with
keep-alive a session carries many requests — and ``stot`` (sessions) otherwise.

Rate = Δcount / Δt between two samples of the same series, using event timestamps. A counter
that goes down means the load balancer restarted (or was reloaded): that interval is skipped, never
reported as a negative rate. A sample whose timestamp does not advance (a duplicate from an
at-least-once replay) is ignored. Series silent for ``ttl_s`` (receive time: a sample stamped in
the future stops refreshing its series, so it cannot pin it) are forgotten and removed from the
gauges, and so are the least recently seen beyond ``max_series`` (the worker's ``stream.max_state_keys``); both counted in
``opsloop_stream_state_dropped_total{handler="lb-rates"}``. Tag values longer than a label takes are
shortened to a prefix and a hash (streams/runtime/gauges.py, ``label_value``), counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prometheus_client import Counter, Gauge

from opsloop.config import StreamSettings
from opsloop.records import Metric
from opsloop.streams.bounded import DEFAULT_MAX_STATE_KEYS, STATE_KEYS, Recency, count_dropped
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, child, label_value

HRSP_FIELDS = ("hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx", "hrsp_other")
# Stock Telegraf inputs.haproxy renames hrsp_* to http_response.*.
TELEGRAF_HRSP_FIELDS = tuple(f"http_response.{c}" for c in ("1xx", "2xx", "3xx", "4xx", "5xx", "other"))

SERVER_RATE = Gauge("opsloop_lb_server_requests_per_second", "Requests per second to one origin server",
                    ["lb", "backend", "server"])
BACKEND_RATE = Gauge("opsloop_lb_backend_requests_per_second", "Requests per second through one backend",
                     ["lb", "backend"])
FRONTEND_RATE = Gauge("opsloop_lb_frontend_requests_per_second", "Requests per second into one frontend (listener)",
                      ["lb", "frontend"])
SERVER_WEIGHT = Gauge("opsloop_lb_server_weight", "Current effective weight of a server", ["lb", "backend", "server"])
SERVER_UP = Gauge("opsloop_lb_server_up", "1 when the load balancer considers the server UP", ["lb", "backend", "server"])
COUNTER_RESETS = Counter("opsloop_lb_resets_total", "Times an LB's request counters went down (LB restart)",
                         ["lb"])


@dataclass(slots=True)
class _Last:
    ts: float
    count: float
    seen_at: float


@dataclass(slots=True, frozen=True)
class Rate:
    lb: str
    kind: str  # frontend | backend | server
    proxy: str
    server: str
    rate: float
    timestamp: float


def request_count(fields: dict[str, object]) -> float | None:
    for names in (HRSP_FIELDS, TELEGRAF_HRSP_FIELDS):
        total = 0.0
        found = False
        for f in names:
            v = fields.get(f)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total += v
                found = True
        if found:
            return total
    for f in ("req_tot", "stot"):
        v = fields.get(f)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class LbRates:
    """Stream handler: turns HAProxy counter samples into request-rate gauges (and returns the rates)."""

    name = "lb-rates"
    names = frozenset({"haproxy"})   # the only samples handle() reads

    def __init__(self, ttl_s: float = 120.0, max_series: int = DEFAULT_MAX_STATE_KEYS) -> None:
        self.ttl_s = ttl_s
        # series by the receive time of their last accepted sample; what expiry and the cap act on
        self._recent: Recency[tuple[str, str, str, str]] = Recency(ttl_s, max_series)
        # the series the last handled batch dropped, for a handler running after this one
        self.dropped: list[tuple[str, str, str, str]] = []
        self._last: dict[tuple[str, str, str, str], _Last] = {}
        self.latest: dict[tuple[str, str, str, str], Rate] = {}
        # (lb, backend) -> server -> latest rate: what a consumer of one backend's servers reads
        self._servers: dict[tuple[str, str], dict[str, Rate]] = {}
        # the rates of the last handled batch, for a handler that runs after this one on the same batch
        self.fresh: list[Rate] = []

    @classmethod
    def from_settings(cls, stream: StreamSettings) -> "LbRates":
        """The worker's handler: ``stream.series_ttl_s`` and a cap of ``stream.max_state_keys`` series."""
        return cls(ttl_s=stream.series_ttl_s, max_series=stream.max_state_keys)

    def servers(self, lb: str, backend: str) -> dict[str, Rate]:
        """Latest rate of every server of one backend (a view: do not modify)."""
        return self._servers.get((lb, backend), {})

    def handle(self, metrics: Sequence[Metric], now: float) -> list[Rate]:
        self.fresh = []
        self.dropped = []
        self._expire(now)   # first: a series back after a silence starts afresh, no rate across the gap
        out: list[Rate] = []
        states: dict[tuple[str, str, str], dict[str, object]] = {}
        for m in metrics:
            if m.name != "haproxy":
                continue
            r = self._update(m, now, states)
            if r is not None:
                out.append(r)
        # Gauges are set once per series and batch (the newest value), not once per sample.
        newest: dict[tuple[str, str, str, str], Rate] = {}
        for r in out:
            newest[(r.lb, r.kind, r.proxy, r.server)] = r
        for (lb, kind, proxy, sv), r in newest.items():
            if kind == "server":
                child(SERVER_RATE, lb, proxy, sv).set(r.rate)
            elif kind == "backend":
                child(BACKEND_RATE, lb, proxy).set(r.rate)
            else:
                child(FRONTEND_RATE, lb, proxy).set(r.rate)
        for (lb, proxy, sv), fields in states.items():
            self._server_state(lb, proxy, sv, fields)
        if len(self._recent) > self._recent.cap:
            self._expire(now)
        self.fresh = out
        return out

    def _update(self, m: Metric, now: float, states: dict[tuple[str, str, str], dict[str, object]]) -> Rate | None:
        tags = m.tags
        lb = tags.get("host") or tags.get("server") or "unknown"
        kind = (tags.get("type") or "").lower()
        proxy = tags.get("proxy", "")
        sv = tags.get("sv", "")
        if kind not in ("frontend", "backend", "server"):
            kind = {"FRONTEND": "frontend", "BACKEND": "backend"}.get(sv, "server")
        if len(lb) > MAX_LABEL_VALUE or len(proxy) > MAX_LABEL_VALUE or len(sv) > MAX_LABEL_VALUE:
            # label values, bounded here so the state key, the gauges and their removal agree
            lb, proxy, sv = (label_value(self.name, "host", lb), label_value(self.name, "proxy", proxy),
                             label_value(self.name, "sv", sv))
        key = (lb, kind, proxy, sv)
        if kind == "server":
            states[(lb, proxy, sv)] = m.fields
        count = request_count(m.fields)
        if count is None:
            if kind == "server":
                self._recent.seen(key, now)   # its weight/up gauges expire with it
            return None
        prev = self._last.get(key)
        if prev is None:
            self._last[key] = _Last(m.timestamp, count, now)
            self._recent.seen(key, now)
            return None
        prev_ts, prev_count = prev.ts, prev.count
        if m.timestamp <= prev_ts:
            return None
        prev.ts, prev.count, prev.seen_at = m.timestamp, count, now   # in place: no object per sample
        self._recent.seen(key, now)
        if count < prev_count:
            COUNTER_RESETS.labels(lb).inc()
            return None
        rate = (count - prev_count) / (m.timestamp - prev_ts)
        r = Rate(lb, kind, proxy, sv, rate, m.timestamp)
        self.latest[key] = r
        if kind == "server":
            self._servers.setdefault((lb, proxy), {})[sv] = r
        return r

    @staticmethod
    def _server_state(lb: str, proxy: str, sv: str, fields: dict[str, object]) -> None:
        w = fields.get("weight")
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            child(SERVER_WEIGHT, lb, proxy, sv).set(w)
        status = fields.get("status")
        if isinstance(status, str):
            child(SERVER_UP, lb, proxy, sv).set(1.0 if status.upper().startswith("UP") else 0.0)

    def _expire(self, now: float) -> None:
        expired = self._recent.expired(now)
        if not expired:
            return
        count_dropped(self.name, expired)
        STATE_KEYS.labels(self.name).set(len(self._recent))
        for key, _ in expired:
            self.dropped.append(key)
            self._last.pop(key, None)
            self.latest.pop(key, None)
            lb, kind, proxy, sv = key
            servers = self._servers.get((lb, proxy))
            if kind == "server" and servers is not None:
                servers.pop(sv, None)
                if not servers:
                    del self._servers[(lb, proxy)]
            gauge_removals = {
                "server": [(SERVER_RATE, (lb, proxy, sv)), (SERVER_WEIGHT, (lb, proxy, sv)), (SERVER_UP, (lb, proxy, sv))],
                "backend": [(BACKEND_RATE, (lb, proxy))],
                "frontend": [(FRONTEND_RATE, (lb, proxy))],
            }[kind]
            for gauge, labels in gauge_removals:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass
