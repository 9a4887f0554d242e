"""The plant of ``opsloop sim`` — latency-elastic clients, the network and the origins — and one
controller's closed-loop :class:`Run` on it.

Per time step ``dt_s``:

- each origin has a capacity (req/s, the policy limit the controller must respect), a service time,
  and a health; above capacity its service time grows (``service_ms · (1 + overload_slowdown ·
  (load/capacity - 1))``);
- each edge's clients see the mean latency of their weights, ``L = Σ_o w_o (latency_o + service_o)``,
  and request at ``base_rps · (L_ref / L)^elasticity`` (``L_ref`` = the nearest origin unloaded;
  elasticity 1 = closed-loop clients like a curl loop, 0 = open loop; both latencies at least
  1 ms, so a 0 ms path answering in 0 ms is defined), reached with a
  first-order lag ``client_tau_s``; requests to an unhealthy origin fail;
- every ``interval_s`` the controller gets each edge's mean request rate over the interval (with
  relative noise ``noise``), the capacities, latencies and health, and pushes new weights.

Events at given times change base demand, capacity, health or latency, or freeze the telemetry
(``stale_for_s``). Every controller runs on the same plant, events and noise sequence.

Plant extras (optional scenario fields): ``demand_noise`` (true demand noise, redrawn every
``demand_noise_period_s``, from its own random stream), ``health_detection_delay_s`` (the
controller sees health that late), events with ``ramp_s`` (a demand change spread linearly) and
``demand_scale`` per edge; the controller also gets the origins' mean response time per interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from opsloop.controllers.edge.base import Controller, Observation
from opsloop.controllers.edge.baselines import FixedStepController, UndampedController
from opsloop.controllers.edge.controller import EdgeController
from opsloop.controllers.edge.sim.scenario import (CONTROLLER_KINDS, Event, Scenario, ScenarioError,
                                                   canonical_kind)

_FAILED_LATENCY_MS = 1000.0  # a request to an unhealthy/unreachable origin: a timeout
# a client's round trip is at least this long: a 0 ms path with a 0 ms service time made the
# clients' latency ratio 0/0 (NaN rates, NaN in --json) or sent an edge's demand to zero
_MIN_ROUND_TRIP_MS = 1.0


@dataclass
class Run:
    """One controller's closed-loop run: samples every dt, decisions every interval."""

    controller: str
    times: np.ndarray                 # [T] sample times (end of each dt)
    loads: np.ndarray                 # [T, O] req/s reaching each origin (failed excluded)
    capacity: np.ndarray              # [T, O]
    healthy: np.ndarray               # [T, O]
    rates: np.ndarray                 # [T, E] client request rate per edge
    latency: np.ndarray               # [T, E] mean latency clients see (ms)
    failed: np.ndarray                # [T] req/s sent to unhealthy/unreachable origins
    tick_times: np.ndarray            # [K]
    tick_weights: np.ndarray          # [K+1, E, O] weights in force from each tick (row 0: t=0)
    tick_modes: list[str] = field(default_factory=list)
    tick_reasons: list[str] = field(default_factory=list)
    # [T] the least overload factor any weights could reach where edges reach only some origins (metrics)
    reach_bound: np.ndarray | None = None


def latency_matrix(scn: Scenario) -> np.ndarray:
    origins = [o.name for o in scn.origins]
    return np.array([[e.latency_ms.get(o, math.inf) for o in origins] for e in scn.edges],
                    dtype=float)


def _initial_weights(scn: Scenario, latency: np.ndarray, healthy: np.ndarray) -> np.ndarray:
    origins = [o.name for o in scn.origins]
    weights = np.zeros(latency.shape)
    for i, edge in enumerate(scn.edges):
        if edge.initial_weights:
            row = np.array([edge.initial_weights.get(o, 0.0) for o in origins])
            weights[i] = row / row.sum()
        else:  # traffic starts on the nearest healthy origin
            usable = np.isfinite(latency[i]) & healthy
            pool = usable if usable.any() else np.isfinite(latency[i])
            weights[i, int(np.argmin(np.where(pool, latency[i], np.inf)))] = 1.0
    return weights


def make_controller(kind: str, scn: Scenario, initial: np.ndarray) -> Controller:
    n_edges, n_origins = initial.shape
    kind = canonical_kind(kind)
    if kind == "ours":
        settings = scn.controller.model_copy(update={"interval_s": scn.interval_s})
        return EdgeController(n_edges, n_origins, settings, initial=initial,
                              origin_names=[o.name for o in scn.origins])
    fixed = scn.fixed_step.model_copy(update={"interval_s": scn.interval_s})
    if kind == "fixed-step":
        return FixedStepController(n_edges, n_origins, fixed, initial=initial)
    if kind == "fixed-step-headroom":
        fixed = fixed.model_copy(update={"headroom": scn.controller.headroom})
        return FixedStepController(n_edges, n_origins, fixed, initial=initial)
    if kind == "undamped":
        return UndampedController(n_edges, n_origins, fixed, initial=initial)
    raise ScenarioError(f"unknown controller {kind!r} (known: {', '.join(CONTROLLER_KINDS)})")


class Plant:
    """The physical side: clients, network, origins."""

    def __init__(self, scn: Scenario) -> None:
        self.scn = scn
        self.latency = latency_matrix(scn)
        self.capacity = np.array([o.capacity_rps for o in scn.origins], dtype=float)
        self.service = np.array([o.service_ms for o in scn.origins], dtype=float)
        self.healthy = np.array([o.healthy for o in scn.origins], dtype=bool)
        self.base = np.array([e.base_rps for e in scn.edges], dtype=float)
        self.elasticity = np.array([e.elasticity for e in scn.edges], dtype=float)
        with np.errstate(invalid="ignore"):
            self.reference = np.min(self.latency + self.service[None, :], axis=1)
        self.rates = np.zeros(len(scn.edges))
        self.loads = np.zeros(len(scn.origins))
        self.ramp_from: np.ndarray = self.base.copy()
        self.ramp_to: np.ndarray | None = None
        self.ramp_at, self.ramp_s = 0.0, 1.0
        self.demand_factor = np.ones(len(scn.edges))  # true demand noise in force

    def apply(self, ev: Event) -> None:
        edges = [e.name for e in self.scn.edges]
        origins = [o.name for o in self.scn.origins]
        if ev.demand_scale is not None or ev.demand:
            self._apply_demand(ev, edges)
        for origin, cap in (ev.capacity or {}).items():
            self.capacity[origins.index(origin)] = cap
        for origin, ok in (ev.health or {}).items():
            self.healthy[origins.index(origin)] = ok
        for edge, row in (ev.latency or {}).items():
            for origin, ms in row.items():
                self.latency[edges.index(edge), origins.index(origin)] = ms

    def _apply_demand(self, ev: Event, edges: list[str]) -> None:
        """The event's demand change: with ``ramp_s``, a ramp from the demand now to the change applied on the demand
        a ramp under way was heading for; without, a step. A step during a ramp moves the ramp with it (its current
        demand and its end alike, an edge set to a rate leaves the ramp), and the ramp goes on: before, any event
        (a capacity, health or latency change too) put the demand at once at the ramp's end."""
        def changed(target: np.ndarray) -> np.ndarray:
            target = target.copy()
            if isinstance(ev.demand_scale, dict):
                for edge, factor in ev.demand_scale.items():
                    target[edges.index(edge)] *= factor
            elif ev.demand_scale is not None:
                target = target * ev.demand_scale
            for edge, rps in (ev.demand or {}).items():
                target[edges.index(edge)] = rps
            return target

        if ev.ramp_s:  # linear from the rate now to the new one over ramp_s
            target = changed(self.ramp_to if self.ramp_to is not None else self.base)
            self.ramp_from, self.ramp_to = self.base.copy(), target
            self.ramp_at, self.ramp_s = ev.at, ev.ramp_s
        elif self.ramp_to is not None:
            # the ramp goes on from the moved demand to its moved end, over the rest of its time
            frac = min(1.0, max(0.0, (ev.at - self.ramp_at) / self.ramp_s))
            self.base, self.ramp_to = changed(self.base), changed(self.ramp_to)
            self.ramp_from = self.base if frac >= 1.0 else (self.base - self.ramp_to * frac) / (1.0 - frac)
        else:
            self.base = changed(self.base)

    def ramp(self, t: float) -> None:
        """Base demand at time ``t`` while a ramp is under way."""
        if self.ramp_to is None:
            return
        frac = min(1.0, max(0.0, (t - self.ramp_at) / self.ramp_s))
        self.base = self.ramp_from + (self.ramp_to - self.ramp_from) * frac
        if frac >= 1.0:
            self.ramp_to = None

    def _route(self, weights: np.ndarray, rates: np.ndarray) -> tuple[np.ndarray, float]:
        working = np.isfinite(self.latency) & self.healthy[None, :]
        flows = weights * rates[:, None]
        return np.where(working, flows, 0.0).sum(axis=0), float(np.where(working, 0.0, flows).sum())

    def client_latency(self, weights: np.ndarray) -> np.ndarray:
        # load over capacity, bounded: a zero-capacity origin with load counts as 100× overloaded
        rho = np.clip(self.loads / np.maximum(self.capacity, 1e-9), 0.0, 100.0)
        service = self.service * (1.0 + self.scn.overload_slowdown * np.clip(rho - 1.0, 0.0, None))
        self.service_now = service
        working = np.isfinite(self.latency) & self.healthy[None, :]
        per_pair = np.where(working, self.latency + service[None, :], _FAILED_LATENCY_MS)
        return (weights * per_pair).sum(axis=1)

    def settle_clients(self, weights: np.ndarray) -> None:
        """Start at the clients' equilibrium for the initial weights."""
        self.rates = self.base.copy()
        for _ in range(50):
            self.loads, _ = self._route(weights, self.rates)
            self.rates = self.base * self._latency_factor(self.client_latency(weights))

    def _latency_factor(self, latency: np.ndarray) -> np.ndarray:
        """Elastic clients' rate at ``latency`` relative to their rate at the reference."""
        ratio = np.maximum(self.reference, _MIN_ROUND_TRIP_MS) / np.maximum(latency, _MIN_ROUND_TRIP_MS)
        return ratio ** self.elasticity

    def advance(self, weights: np.ndarray, dt: float) -> tuple[np.ndarray, float, np.ndarray]:
        latency = self.client_latency(weights)
        wanted = self.base * self.demand_factor * self._latency_factor(latency)
        lag = 1.0 if self.scn.client_tau_s == 0 else 1.0 - math.exp(-dt / self.scn.client_tau_s)
        self.rates = self.rates + (wanted - self.rates) * lag
        self.loads, failed = self._route(weights, self.rates)
        return self.loads.copy(), failed, latency


def simulate(scn: Scenario, kind: str,
             build: Callable[[Scenario, np.ndarray], Controller] | None = None) -> Run:
    """Run one controller against the plant: ``kind``'s, or the one ``build`` makes from the scenario and the
    initial weights (a reference policy of a benchmark; ``kind`` then only names the run)."""
    plant = Plant(scn)
    weights = _initial_weights(scn, plant.latency, plant.healthy)
    plant.settle_clients(weights)
    ctrl = make_controller(kind, scn, weights) if build is None else build(scn, weights)
    rng = np.random.default_rng(scn.seed)
    n_steps = int(round(scn.duration_s / scn.dt_s))
    per_tick = int(round(scn.interval_s / scn.dt_s))
    n_ticks = n_steps // per_tick
    # a rate read off counters is never below 0 (at noise 0.5 one draw in 40 would be)
    noise = np.clip(1.0 + scn.noise * rng.standard_normal((n_ticks + 1, len(scn.edges))), 0.0, None)
    # true demand noise from its own stream: adding it leaves the measurement noise sequence alone
    demand_rng = np.random.default_rng([scn.seed, 1])
    noise_period = max(1, int(round((scn.demand_noise_period_s or scn.interval_s) / scn.dt_s)))
    delay_steps = int(round(scn.health_detection_delay_s / scn.dt_s))
    events = sorted(scn.events, key=lambda ev: ev.at)
    next_event = 0
    n_e, n_o = len(scn.edges), len(scn.origins)
    loads = np.zeros((n_steps, n_o))
    caps = np.zeros((n_steps, n_o))
    health = np.zeros((n_steps, n_o), dtype=bool)
    rates = np.zeros((n_steps, n_e))
    lat = np.zeros((n_steps, n_e))
    failed = np.zeros(n_steps)
    tick_times, tick_weights, modes, reasons = [], [weights.copy()], [], []
    counted = np.zeros(n_e)
    answered = np.zeros(n_o)  # origin response time × requests, for the interval's mean
    stale_until = -1.0
    last_fresh: tuple[float, np.ndarray, np.ndarray] | None = None
    for i in range(n_steps):
        t = i * scn.dt_s
        while next_event < len(events) and events[next_event].at < t + scn.dt_s - 1e-9:
            ev = events[next_event]
            plant.apply(ev)
            if ev.stale_for_s is not None:
                stale_until = max(stale_until, ev.at + ev.stale_for_s)
            next_event += 1
        plant.ramp(t + scn.dt_s)
        if scn.demand_noise > 0 and i % noise_period == 0:
            draw = demand_rng.standard_normal(len(scn.edges))
            plant.demand_factor = np.clip(1.0 + scn.demand_noise * draw, 0.0, None)
        loads[i], failed[i], lat[i] = plant.advance(weights, scn.dt_s)
        caps[i], health[i], rates[i] = plant.capacity, plant.healthy, plant.rates
        counted += plant.rates * scn.dt_s
        answered += plant.service_now * np.maximum(loads[i], 1e-9) * scn.dt_s
        if (i + 1) % per_tick == 0:
            now = (i + 1) * scn.dt_s
            k = (i + 1) // per_tick
            measured = counted / scn.interval_s * noise[k]
            counted = np.zeros(n_e)
            # origin response time over the interval, request-weighted (what an LB's timers show)
            weight = np.maximum(loads[i + 1 - per_tick:i + 1], 1e-9).sum(axis=0) * scn.dt_s
            origin_ms, answered = answered / weight, np.zeros(n_o)
            if now <= stale_until and last_fresh is not None:
                measured, age, origin_ms = last_fresh[1], now - last_fresh[0], last_fresh[2]
            else:
                last_fresh, age = (now, measured, origin_ms), 0.0
            # health as the checks report it: what it was health_detection_delay_s ago
            seen_health = health[i - delay_steps] if i >= delay_steps else health[0]
            decision = ctrl.step(Observation(now=now, demand=measured, capacity=plant.capacity.copy(),
                                             latency=plant.latency.copy(),
                                             healthy=seen_health.copy(), inputs_age_s=age,
                                             health_age_s=0.0,   # checks stay current when demand is stale
                                             origin_latency_ms=origin_ms))
            weights = decision.weights
            tick_times.append(now)
            tick_weights.append(weights.copy())
            modes.append(decision.mode.value)
            reasons.append(decision.reason)
    return Run(controller=kind, times=(np.arange(n_steps) + 1) * scn.dt_s, loads=loads,
               capacity=caps, healthy=health, rates=rates, latency=lat, failed=failed,
               tick_times=np.array(tick_times), tick_weights=np.array(tick_weights),
               tick_modes=modes, tick_reasons=reasons)
