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

The listener is the HAProxy backend name; the control service maps it to its topology's listeners.
"""

from __future__ import annotations

import math
from typing import Sequence

from prometheus_client import Counter

from opsloop.records import EdgeDemand, Metric, OriginState
from opsloop.records.edge import MAX_RATE_RPS, MAX_RESPONSE_MS
from opsloop.streams.agents.base import log
from opsloop.streams.lb.rates import LbRates

REFUSED = Counter("opsloop_edge_demand_refused_total",
                  "Demand rounds not sent: a rate beyond 1e12 req/s (a corrupt counter)")

DOWN_STATUSES = ("DOWN", "MAINT")


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

    def handle(self, metrics: Sequence[Metric], now: float) -> list[EdgeDemand]:
        fresh = self.rates.handle(metrics, now) if self._own_rates else self.rates.fresh
        for lb, kind, proxy, sv in self.rates.dropped:   # a server the rates forgot: its status goes too
            if kind == "server":
                self.status.pop((lb, proxy, sv), None)
                self.rtime.pop((lb, proxy, sv), None)
        for m in metrics:
            if m.name == "haproxy" and (m.tags.get("type") or "").lower() == "server":
                key = (m.tags.get("host") or m.tags.get("server") or "unknown",
                       m.tags.get("proxy", ""), m.tags.get("sv", ""))
                status = m.fields.get("status")
                if isinstance(status, str):
                    self.status[key] = status
                rtime = m.fields.get("rtime")
                if isinstance(rtime, (int, float)) and not isinstance(rtime, bool) \
                        and math.isfinite(rtime) and 0 <= rtime <= MAX_RESPONSE_MS:
                    self.rtime[key] = float(rtime)
        touched = sorted({(r.lb, r.proxy) for r in fresh if r.kind in ("server", "backend")})
        out = [rec for lb, backend in touched if (rec := self._record(lb, backend)) is not None]
        self.outbox.extend(out)
        return out

    def _record(self, lb: str, backend: str) -> EdgeDemand | None:
        servers = self.rates.servers(lb, backend)
        rates = {sv: max(0.0, r.rate) for sv, r in servers.items() if math.isfinite(r.rate)}
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
