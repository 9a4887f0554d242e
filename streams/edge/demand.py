"""Aggregate HAProxy request rates into per-edge, per-listener demand records for ``edge.demand``.

Input: ``telemetry.lb`` samples (``haproxy`` measurement, tags ``host`` = the load balancer = the
*edge*, ``proxy``, ``sv``, ``type``). Rates come from :class:`opsloop.streams.lb.rates.LbRates` (Δcount/Δt
on event time, counter resets skipped). Output, once per edge, backend and collection round: one
:class:`opsloop.records.EdgeDemand` — demand = Σ server request rates of the backend (what the edge *offered* the
origins, 503s included: an origin rejecting load above its capacity must not hide the demand), or
the backend's own rate when it has no server rows — plus each server's rate and whether HAProxy
considers it up (``DOWN``/``MAINT`` → down; ``DRAIN``, i.e. weight 0, is still up), and its mean
response time (HAProxy's ``rtime``: ms over the last 1024 requests, network to the server included),
which the controller reads to predict how fast relieved clients come back.

A server counts in the sum while its latest rate is recent against the backend's newest one: within
``STALE_INTERVALS`` collection intervals (the intervals the rates were measured over), so a server
removed from the backend leaves the sum after two missed rounds, not after ``series_ttl_s``. A
server's status and rtime are read from the rows :class:`LbRates` keyed its rate by (the same
shortened tags, a row without a type tag a server), the status cut to ``MAX_STATUS_CHARS``. A
record that cannot be built (a bad value in one backend) is counted and skipped; the others are sent.

The listener is the HAProxy backend name; the control service maps it to its topology's listeners.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Sequence

from prometheus_client import Counter

from opsloop.log import Sampled
from opsloop.records import EdgeDemand, Metric, OriginState
from opsloop.records.edge import MAX_RATE_RPS, MAX_RESPONSE_MS, MAX_STATUS_CHARS
from opsloop.streams.agents.base import log
from opsloop.streams.lb.rates import LbRates, Rate
from opsloop.streams.runtime.batch import HandlerFailure

REFUSED = Counter("opsloop_edge_demand_refused_total",
                  "Demand rounds not sent: a rate beyond 1e12 req/s (a corrupt counter)")
INVALID = Counter("opsloop_edge_demand_invalid_total",
                  "Demand records of one edge and backend that could not be built (an invalid value): "
                  "skipped, the batch's other records sent")
# a backend that fails every round: one log line a minute (the counter carries the rate)
INVALID_LOG = Sampled(60.0)

DOWN_STATUSES = ("DOWN", "MAINT")
# A server is in the sum while its latest rate is at most this many collection intervals older than
# the backend's newest: one missed round (1 interval) is tolerated, two are not (removed), with half
# an interval for the jitter of collection times.
STALE_INTERVALS = 1.5


def server_up(status: object) -> bool:
    return not (isinstance(status, str) and status.strip().upper().startswith(DOWN_STATUSES))


class DemandAggregator:
    """Stream handler (``handle(metrics, now)``, no I/O): fills :attr:`outbox` with demand records.

    The agent sends and clears the outbox after each batch. A backend is reported once per batch in
    which any of its rows produced a new rate, so one collection round gives one record per edge.
    """

    name = "edge-demand"

    def __init__(self, ttl_s: float = 120.0, rates: LbRates | None = None) -> None:
        # Standalone it computes its own rates. Given the worker's LbRates, it reads the rates that
        # handler computed for the same batch (it must run right after it) instead of computing them twice.
        self._own_rates = rates is None
        self.rates = LbRates(ttl_s=ttl_s) if rates is None else rates
        self.status: dict[tuple[str, str, str], str] = {}   # (lb, backend, server) -> HAProxy status
        self.rtime: dict[tuple[str, str, str], float] = {}  # (lb, backend, server) -> rtime ms
        self.outbox: list[EdgeDemand] = []
        self.refused = 0   # records not sent: a rate beyond MAX_RATE_RPS (a corrupt counter)
        self.invalid = 0   # records that could not be built (INVALID)

    def handle(self, metrics: Sequence[Metric], now: float) -> list[EdgeDemand]:
        fresh = self.rates.handle(metrics, now) if self._own_rates else self.rates.fresh
        for lb, kind, proxy, sv in self.rates.dropped:   # a server the rates forgot: its status goes too
            if kind == "server":
                self.status.pop((lb, proxy, sv), None)
                self.rtime.pop((lb, proxy, sv), None)
        # the server rows as LbRates keyed them (tags shortened, an untyped row a server): the status
        # of a server is found under its rate's key, and goes when its series is dropped
        for key, fields in self.rates.server_rows.items():
            status = fields.get("status")
            if isinstance(status, str):
                # bounded: a 1 MB status made every record of its backend too big to send
                self.status[key] = status.strip()[:MAX_STATUS_CHARS]
            rtime = fields.get("rtime")
            if isinstance(rtime, (int, float)) and not isinstance(rtime, bool) \
                    and math.isfinite(rtime) and 0 <= rtime <= MAX_RESPONSE_MS:
                self.rtime[key] = float(rtime)
        touched = sorted({(r.lb, r.proxy) for r in fresh if r.kind in ("server", "backend")})
        out = []
        for lb, backend in touched:
            try:   # one record each: a bad one must not cost the batch's good ones
                rec = self._record(lb, backend)
            except Exception as e:  # noqa: BLE001 - counted, logged, skipped
                self.invalid += 1
                INVALID.inc()
                INVALID_LOG.warning(log, "edge_demand_invalid", key="invalid", edge=lb[:200],
                                    backend=backend[:200], error=f"{type(e).__name__}: {str(e)[:300]}")
                continue
            if rec is not None:
                out.append(rec)
        self.outbox.extend(out)
        return out

    def drain_rejected(self) -> list[HandlerFailure]:
        """Standalone: the samples its own rates refused (the runtime dead-letters them); sharing the
        worker's LbRates, that handler reports them."""
        return self.rates.drain_rejected() if self._own_rates else []

    def _record(self, lb: str, backend: str) -> EdgeDemand | None:
        servers = self.rates.servers(lb, backend)
        rates = {sv: max(0.0, r.rate) for sv, r in _current(servers).items() if math.isfinite(r.rate)}
        if rates:
            demand = math.fsum(rates.values())
            ts = max(r.timestamp for r in servers.values())
        else:
            row = self.rates.latest.get((lb, "backend", backend, "BACKEND"))
            if row is None or not math.isfinite(row.rate):
                return None
            demand, ts = max(0.0, row.rate), row.timestamp
        if demand > MAX_RATE_RPS:
            # no measurement (a counter that jumped by 1e18): not sent, so the controller's last
            # good record ages into staleness (fail static) instead of a record it must refuse
            self.refused += 1
            REFUSED.inc()
            log.warning("edge_demand_refused", edge=lb, backend=backend,
                        error=f"demand {demand:g} req/s: beyond {MAX_RATE_RPS:g}")
            return None
        origins = {sv: OriginState(rps=rps, status=self.status.get((lb, backend, sv), ""),
                                   up=server_up(self.status.get((lb, backend, sv))),
                                   rtime_ms=self.rtime.get((lb, backend, sv)))
                   for sv, rps in rates.items()}
        return EdgeDemand(edge=lb, backend=backend, demand_rps=demand, origins=origins, timestamp=ts)

    def drain(self) -> list[EdgeDemand]:
        out, self.outbox = self.outbox, []
        return out


def _current(servers: dict[str, Rate]) -> dict[str, Rate]:
    """The servers whose latest rate is within STALE_INTERVALS collection intervals of the newest."""
    if len(servers) < 2:
        return servers
    newest = max(servers.values(), key=attrgetter("timestamp"))
    return {sv: r for sv, r in servers.items()
            if newest.timestamp - r.timestamp <= STALE_INTERVALS * max(r.interval, newest.interval)}
