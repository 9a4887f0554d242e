"""Per-backend and per-server request rates from load-balancer counters.

Input samples (our HAProxy collector and Telegraf's ``inputs.haproxy`` write the same shape):
``haproxy`` with tags ``host`` (the load balancer), ``proxy``, ``sv``, ``type``
(frontend/backend/server) and the ``show stat`` counters as fields. The request count of a row is
the sum of its HTTP response counters (``hrsp_1xx`` … ``hrsp_other``) when present — with
keep-alive a session carries many requests — and ``stot`` (sessions) otherwise. A series remembers
which counters made its count: when a row brings another set (a torn row missing some columns, or
none so that ``stot`` stands in), the series starts afresh from it (no rate that round, no reset
counted) instead of taking the difference of two different sums for traffic.

The kind of a row is its ``type`` tag; only a row without one is inferred (``sv`` = FRONTEND/BACKEND,
else a server). Rows typed ``listener`` (a frontend's sockets, ``show stat`` type 3) or ``unknown``
are not counted; a row with an empty ``proxy`` tag (or another type) is refused: counted in
``opsloop_lb_samples_rejected_total`` and handed to the runtime to dead-letter (``drain_rejected``), and so
is a row whose request counter is there but no count (negative, or not a number: a glitch; taken, it read
as a reset and made the next good row a spike of the whole counter).
The last server rows of a batch, by the same (shortened) key as their rates, are in
:attr:`LbRates.server_rows` for a handler running after this one.

Rate = Δcount / Δt between two samples of the same series, using event timestamps. A counter
that goes down is never reported as a negative rate: that interval is skipped, and the next reading
tells what the drop was. Back at or above the reading before the drop, it was a glitch (a stats read
during a reload, HAProxy nbproc with its processes answering the stats socket in turn): the rate runs
across it from that reading, counted in ``opsloop_lb_glitches_total``. Still below it, the load balancer
restarted (or was reloaded, or a 32-bit counter wrapped): counted in ``opsloop_lb_resets_total``, the
rate taken from the low reading on. Before, every drop was a restart and a glitch's next reading a rate
of the whole counter over one interval (a spike of 100x sent to the edge controller as demand). A
restart whose counter regains its old value within one interval reads as a glitch: its rate is then
under the true one, never above it. A sample whose timestamp does not advance (a duplicate from an
at-least-once replay, an older round of a spool replayed after a newer one) is ignored. Two readings stamped
within max(0.25 s, half the series' collection interval) of each other are the same round read twice (the
other collector of an HA pair): the later is skipped, counted ``same_round`` in
``opsloop_lb_out_of_step_samples_total`` (rated, the stamps' jitter made 10x spikes). A reading stamped earlier
than the last while its counter went on (the collector's clock stepped back) restarts the series' time base
from it, counted ``clock_back``: ignored, the series said nothing until the clock caught up, then rated the
step's traffic over one round (4x for 30 s). A counter beyond 2^64 (HAProxy's are unsigned 64-bit), infinite
or NaN is no count: refused like a negative one (a sum of two 1e308s was inf, its NaN rate left the server out
of the demand unsaid). Series silent for ``ttl_s`` (receive time: a sample stamped in
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
from opsloop.log import Sampled, get_logger
from opsloop.records import Metric
from opsloop.streams.bounded import DEFAULT_MAX_STATE_KEYS, STATE_KEYS, Recency, count_dropped
from opsloop.streams.runtime.batch import HandlerFailure, Refusals
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, child, label_value

log = get_logger("stream.lb")

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
COUNTER_RESETS = Counter("opsloop_lb_resets_total", "Times an LB's request counters went down and stayed down "
                         "(LB restart or reload, a 32-bit wrap): counted at the reading after the drop", ["lb"])
GLITCHES = Counter("opsloop_lb_glitches_total", "Times an LB's request counter read low once and was back at "
                   "the next reading (a stats read during a reload, nbproc processes answering in turn): "
                   "rated across, no restart", ["lb"])
OUT_OF_STEP = Counter("opsloop_lb_out_of_step_samples_total",
                      "haproxy samples not rated against the series' last reading: same_round (stamped within "
                      "max(0.25 s, half its shortest step) of it: a second collector's read of the same round, "
                      "skipped), clock_back (stamped before it while the counter went on: the source's clock "
                      "stepped back; the series goes on from this reading)", ["lb", "reason"])
REJECTED = Counter("opsloop_lb_samples_rejected_total",
                   "haproxy samples refused by the LB rates (an empty proxy tag, an unknown type, a request "
                   "counter that is no count): skipped, dead-lettered", ["reason"])
KINDS = ("frontend", "backend", "server")
# typed rows that are no request series of ours: a frontend's listening sockets (show stat type 3),
# and what the collector tags a type it does not know
IGNORED_KINDS = frozenset({"listener", "unknown"})
# a poison stream of refused rows: one log line a minute (the counter carries the rate)
REJECT_LOG = Sampled(60.0)
STEP_LOG = Sampled(60.0)
# HAProxy's counters are unsigned 64-bit: a field beyond is no count (and a sum of 1e308s overflowed to inf,
# whose rate was NaN: the server left the demand's sum unsaid)
MAX_COUNT = float(2 ** 64)
# Two readings closer than this (max of an absolute floor and a fraction of the series' collection interval)
# are the same round read twice (the other collector of an HA pair): over milliseconds the stamps' jitter,
# not the traffic, made the rate (10x spikes). The floor covers a series' first step (no interval known yet).
SAME_ROUND_MIN_S = 0.25
SAME_ROUND_FRACTION = 0.5


@dataclass(slots=True)
class _Last:
    ts: float
    count: float
    seen_at: float
    basis: int = 0   # which counters made ``count`` (see count_basis): another set is another sum
    # (ts, count) of the reading before a drop, until the next reading tells a glitch from a restart
    before_drop: tuple[float, float] | None = None
    # the shortest step between two of the series' readings (0: none yet): the collection interval, never the
    # span of a gap (after a gap of 9 rounds, half of it skipped the next 4 rounds as "the same round")
    interval: float = 0.0


@dataclass(slots=True, frozen=True)
class Rate:
    lb: str
    kind: str  # frontend | backend | server
    proxy: str
    server: str
    rate: float
    timestamp: float
    # the collection interval: seconds since the series' previous reading (across a glitch the rate
    # itself spans two; the demand's staleness is measured in collection intervals)
    interval: float = 0.0


COUNTER_FIELDS = (*HRSP_FIELDS, *TELEGRAF_HRSP_FIELDS, "req_tot", "stot")


def bad_counter(fields: dict[str, object]) -> str | None:
    """The first request counter of a row that is there but no count (a finite number in [0, 2^64]), else None."""
    for f in COUNTER_FIELDS:
        v = fields.get(f)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not 0 <= v <= MAX_COUNT):   # NaN fails the comparison too
            return f
    return None


def request_count(fields: dict[str, object]) -> float | None:
    counted = count_basis(fields)
    return None if counted is None else counted[0]


def count_basis(fields: dict[str, object]) -> tuple[float, int] | None:
    """The request count of a row and a bit set of the counters that made it (one bit per field of
    HRSP_FIELDS, then of TELEGRAF_HRSP_FIELDS, then ``req_tot`` and ``stot``); None without any."""
    bit = 1
    for names in (HRSP_FIELDS, TELEGRAF_HRSP_FIELDS):
        total = 0.0
        basis = 0
        for f in names:
            v = fields.get(f)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total += v
                basis |= bit
            bit <<= 1
        if basis:
            return total, basis
    for f in ("req_tot", "stot"):
        v = fields.get(f)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v), bit
        bit <<= 1
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
        # the last handled batch's server rows, newest per server, keyed (lb, proxy, sv) as the rates
        # (tags shortened alike): what a later handler reads a server's status from
        self.server_rows: dict[tuple[str, str, str], dict[str, object]] = {}
        self.rejected = 0   # haproxy samples refused (counted in REJECTED too)
        self._refused = Refusals(self.name)   # until drain_rejected()

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
        self.server_rows = {}
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
        self.server_rows = states
        return out

    def reject(self, m: Metric, reason: str, error: str) -> None:
        """A row that is no series of ours: counted, logged (sampled), kept for the runtime to
        dead-letter (at most MAX_ISOLATED_FAILURES per batch, then one summary)."""
        if not self._refused.add(m, error):   # handed again (the runtime's isolation of a failure)
            return
        self.rejected += 1
        REJECTED.labels(reason).inc()
        REJECT_LOG.warning(log, "lb_sample_rejected", key=reason, handler=self.name, error=error)

    def drain_rejected(self) -> list[HandlerFailure]:
        """The samples refused since the last call (the runtime dead-letters them)."""
        return self._refused.drain()

    def _update(self, m: Metric, now: float, states: dict[tuple[str, str, str], dict[str, object]]) -> Rate | None:
        tags = m.tags
        lb = tags.get("host") or tags.get("server") or "unknown"
        typed = (tags.get("type") or "").lower()
        proxy = tags.get("proxy", "")
        sv = tags.get("sv", "")
        if typed in IGNORED_KINDS:
            return None
        if not proxy:
            # no backend to report (an edge.demand record needs one): refused before it keys any state
            self.reject(m, "empty_proxy", f"haproxy sample of lb {lb[:100]!r} (sv {sv[:100]!r}): empty or "
                                          "missing proxy tag")
            return None
        if typed and typed not in KINDS:
            self.reject(m, "unknown_type", f"haproxy sample of lb {lb[:100]!r}, proxy {proxy[:100]!r}: type tag "
                                           f"{typed[:100]!r} is none of frontend, backend, server, listener")
            return None
        # the kind is inferred only for a row without a type tag
        kind = typed or {"FRONTEND": "frontend", "BACKEND": "backend"}.get(sv, "server")
        if len(lb) > MAX_LABEL_VALUE or len(proxy) > MAX_LABEL_VALUE or len(sv) > MAX_LABEL_VALUE:
            # label values, bounded here so the state key, the gauges and their removal agree
            lb, proxy, sv = (label_value(self.name, "host", lb), label_value(self.name, "proxy", proxy),
                             label_value(self.name, "sv", sv))
        bad = bad_counter(m.fields)
        if bad is not None:
            # a glitch, not traffic: taken, a -5 read as a reset and the next good row as a spike of the
            # whole counter over one interval (10^5 req/s from a server serving 100)
            self.reject(m, "bad_counter", f"haproxy sample of lb {lb[:100]!r}, proxy {proxy[:100]!r}, sv "
                                          f"{sv[:100]!r}: counter {bad} is {m.fields[bad]!r:.100}, not a count")
            return None
        key = (lb, kind, proxy, sv)
        if kind == "server":
            states[(lb, proxy, sv)] = m.fields
        counted = count_basis(m.fields)
        if counted is None:
            if kind == "server":
                self._recent.seen(key, now)   # its weight/up gauges expire with it
            return None
        count, basis = counted
        prev = self._last.get(key)
        if prev is None:
            self._last[key] = _Last(m.timestamp, count, now, basis)
            self._recent.seen(key, now)
            return None
        prev_ts, prev_count, prev_basis, held = prev.ts, prev.count, prev.basis, prev.before_drop
        step = m.timestamp - prev_ts
        if step == 0:
            return None   # a duplicate (an at-least-once replay)
        if abs(step) < max(SAME_ROUND_MIN_S, SAME_ROUND_FRACTION * prev.interval):
            self._recent.seen(key, now)   # alive; rated at the next round from the reading kept
            OUT_OF_STEP.labels(lb, "same_round").inc()
            return None
        if step < 0:
            if count > prev_count and basis == prev_basis and held is None:
                # newer traffic stamped earlier: the source's clock stepped back. Ignored until the clock caught
                # up, the next rate spanned the step's traffic over too short a time (4x for 30 s at 10 s rounds)
                prev.ts, prev.count, prev.seen_at = m.timestamp, count, now
                self._recent.seen(key, now)
                OUT_OF_STEP.labels(lb, "clock_back").inc()
                STEP_LOG.warning(log, "lb_clock_back", key=lb, lb=lb[:200], proxy=proxy[:200], sv=sv[:200],
                                 step_s=round(step, 3), error="a sample stamped before the series' last one while "
                                 "its counter went on: the source's clock stepped back (or a second collector's "
                                 "is behind); the series goes on from it")
            return None   # an older round (a spool replayed after a newer one): no news
        # in place: no object per sample
        prev.ts, prev.count, prev.seen_at, prev.basis = m.timestamp, count, now, basis
        prev.interval = min(prev.interval, step) if prev.interval else step
        self._recent.seen(key, now)
        if basis != prev_basis:
            # other counters, another sum (a torn row without its hrsp_4xx/5xx, stot standing in):
            # their difference is no traffic, nor a restart; the series starts again from this row
            if held is not None:   # a drop this row cannot tell: counted a restart, as every drop was
                prev.before_drop = None
                COUNTER_RESETS.labels(lb).inc()
            return None
        if count < prev_count:
            # a restart, a wrap or a glitch: the next reading tells. A second drop in a row keeps the
            # first one's reading (the highest): a glitch is back above that one
            if held is None:
                prev.before_drop = (prev_ts, prev_count)
            return None
        dt = m.timestamp - prev_ts
        if held is not None:
            # A 32-bit wrap grows from small values again, far below the reading before the drop: a
            # restart here (that interval skipped, not rated across). Were wraps ever rated across, that
            # would have to come after this test: a zero read of a counter near 2^32 would pass for one.
            prev.before_drop = None
            if count >= held[1]:
                GLITCHES.labels(lb).inc()
                prev_ts, prev_count = held   # the low reading was none: rate from the one before it
            else:
                COUNTER_RESETS.labels(lb).inc()
        rate = (count - prev_count) / (m.timestamp - prev_ts)
        r = Rate(lb, kind, proxy, sv, rate, m.timestamp, dt)
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
            last = self._last.pop(key, None)
            if last is not None and last.before_drop is not None:
                COUNTER_RESETS.labels(key[0]).inc()   # a drop never told apart: a restart, as every drop was
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
