"""What every edge-weight controller shares: one tick's :class:`Observation` in, a guarded and
versioned :class:`Decision` out.

A controller's law is its ``_propose`` (a frozen :class:`Proposal`); :meth:`Controller.step`
validates the observation, fails static on stale inputs (holds the last good weights, but still
moves the share off an origin that fresh health checks call down), passes the proposal through the
final guard (:func:`~opsloop.controllers.edge.safety.enforce_safety`) and publishes it with a
version that names the weights (re-applying a version is a no-op for an actuator).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from opsloop.records import EdgeWeights, Mode
from opsloop.controllers.edge.safety import enforce_safety, strip_unusable, usable_mask
from opsloop.controllers.edge.scheduler import (MAX_LATENCY_MS, MAX_RATE, Solution, check_at_most,
                                              check_finite_nonneg, solve)

_EPS = 1e-12


@dataclass
class Observation:
    """What the controller sees at one tick (arrays: edges × origins in a fixed order)."""

    now: float
    demand: np.ndarray          # [E] measured req/s over the last interval
    capacity: np.ndarray        # [O] req/s
    latency: np.ndarray         # [E, O] ms, inf = no path
    healthy: np.ndarray         # [O] bool
    inputs_age_s: float = 0.0   # age of the oldest input this decision relies on
    # age of ``healthy`` when it is known apart from the rest (health checks that stay fresh while
    # the demand measurement is stale); None: as old as the other inputs
    health_age_s: float | None = None
    # [O] mean time an origin took to answer over the interval (queue + service, no network), when
    # the telemetry has it: lets the controller predict how much faster relieved clients come back
    origin_latency_ms: np.ndarray | None = None


@dataclass
class Decision:
    weights: np.ndarray          # [E, O] pushed shares
    target: np.ndarray           # [E, O] the optimal assignment this step aimed at
    mode: Mode
    reason: str
    version: int
    changed: bool
    demand_estimate: np.ndarray  # [E]
    shed_rps: np.ndarray         # [E]
    inputs_age_s: float = 0.0
    held_edges: list[int] = field(default_factory=list)
    now_s: float = 0.0
    stale: bool = False          # fail static on stale inputs: nothing was planned

    def records(self, listener: str, edges: list[str], origins: list[str]) -> list[EdgeWeights]:
        """One :class:`EdgeWeights` per edge, ready for the ``edge.weights`` topic."""
        out = []
        for e, edge in enumerate(edges):
            shed: dict[str, float] = {}
            if self.shed_rps[e] > 0:
                demand = float(self.demand_estimate[e])
                shed = {"rps": float(self.shed_rps[e]),
                        "fraction": float(self.shed_rps[e] / demand) if demand > 0 else 1.0}
            row = self.weights[e] / self.weights[e].sum()
            out.append(EdgeWeights(version=self.version, listener=listener, edge=edge,
                                   weights={o: float(min(1.0, w)) for o, w in zip(origins, row)},
                                   computed_at=max(0.0, self.now_s), mode=self.mode,
                                   reason=self.reason, inputs_age_s=self.inputs_age_s, shed=shed))
        return out


@dataclass(frozen=True)
class Proposal:
    """What a controller's law proposes at one tick, before the final guard (:func:`enforce_safety`)."""

    weights: np.ndarray          # [E, O] proposed shares
    target: np.ndarray           # [E, O] the optimal assignment the step aims at
    demand_estimate: np.ndarray  # [E] the demand it was planned on
    mode: Mode
    reason: str
    shed_rps: np.ndarray         # [E] demand beyond healthy capacity
    held_edges: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, weights: np.ndarray, solution: Solution, estimate: np.ndarray,
           reason: str, target: np.ndarray | None = None) -> "Proposal":
        """A proposal toward ``solution``'s assignment (``target``: another one)."""
        return cls(weights=weights, target=solution.weights if target is None else target,
                   demand_estimate=estimate, mode=_mode_of(solution.status), reason=reason,
                   shed_rps=solution.shed, held_edges=list(solution.held_edges))


def _validate(obs: Observation, n_edges: int, n_origins: int, stale_after_s: float) -> None:
    if np.shape(obs.demand) != (n_edges,) or np.shape(obs.capacity) != (n_origins,) \
            or np.shape(obs.latency) != (n_edges, n_origins) or np.shape(obs.healthy) != (n_origins,):
        raise ValueError(f"observation: expected shapes demand ({n_edges},), capacity ({n_origins},), "
                         f"latency ({n_edges}, {n_origins}), healthy ({n_origins},); got "
                         f"{np.shape(obs.demand)}, {np.shape(obs.capacity)}, "
                         f"{np.shape(obs.latency)}, {np.shape(obs.healthy)}")
    if obs.origin_latency_ms is not None and np.shape(obs.origin_latency_ms) != (n_origins,):
        raise ValueError(f"observation.origin_latency_ms: expected shape ({n_origins},), got "
                         f"{np.shape(obs.origin_latency_ms)}")
    if not np.isfinite(obs.inputs_age_s) or obs.inputs_age_s < 0:
        raise ValueError(f"observation.inputs_age_s: expected a finite number >= 0, "
                         f"got {obs.inputs_age_s!r}")
    check_finite_nonneg("observation.capacity", obs.capacity)  # no law reads a meaning into it
    # beyond what the LP takes as a number (+inf included), refused before any state changes:
    # kept in a law's history, one such reading failed every tick until it left the window
    check_at_most("observation.demand", obs.demand, MAX_RATE, "req/s")
    check_at_most("observation.capacity", obs.capacity, MAX_RATE, "req/s")
    check_at_most("observation.latency", obs.latency, MAX_LATENCY_MS, "ms (inf: no path)",
                  finite_only=True)
    if obs.origin_latency_ms is not None:
        check_at_most("observation.origin_latency_ms", obs.origin_latency_ms, MAX_LATENCY_MS, "ms")
    if obs.inputs_age_s <= stale_after_s:
        # a fresh observation's demand is a measurement to plan on: NaN (none) or a negative rate
        # is no rate, and read as 0 it let the plan put that edge's traffic anywhere (an edge of
        # no demand weighs nothing in the LP); stale inputs may carry NaN (unknown): they are held
        check_finite_nonneg("observation.demand", obs.demand)


class Controller:
    """State and bookkeeping shared by the controllers: last weights, version, fail-static.
    A controller's law is its :meth:`_propose`; :meth:`step` guards and publishes it."""

    name = "base"

    def __init__(self, n_edges: int, n_origins: int, stale_after_s: float, max_step: float,
                 initial: np.ndarray | None = None, origin_names: list[str] | None = None) -> None:
        self.n_edges = n_edges
        self.n_origins = n_origins
        if origin_names is not None and len(origin_names) != n_origins:
            raise ValueError(f"origin_names: expected {n_origins} names, got {len(origin_names)}")
        # what the reasons call the origins (an operator reads them): their names when given
        self.origin_names = list(origin_names) if origin_names is not None else \
            [f"#{o}" for o in range(n_origins)]
        self.stale_after_s = stale_after_s
        self.max_step = max_step
        self.weights: np.ndarray | None = None
        if initial is not None:
            init = np.asarray(initial, dtype=float)
            if init.shape != (n_edges, n_origins) or (init < 0).any() \
                    or (init.sum(axis=1) <= 0).any():
                raise ValueError(f"initial weights: expected non-negative ({n_edges}, {n_origins}) "
                                 f"rows with a positive sum, got {init.tolist()!r}")
            self.weights = init / init.sum(axis=1, keepdims=True)
        self.version = 0

    def _propose(self, obs: Observation) -> Proposal:
        raise NotImplementedError

    def _names(self, mask: np.ndarray, detail=None) -> str:
        """The origins of ``mask`` by name, each with ``detail(o)`` when given."""
        return ", ".join(self.origin_names[o] + (f" {detail(o)}" if detail else "")
                         for o in np.flatnonzero(mask))

    def _publish(self, obs: Observation, decided: Proposal, stale: bool = False) -> Decision:
        weights = decided.weights
        changed = self.weights is None or not np.allclose(weights, self.weights, atol=1e-9, rtol=0)
        if changed:  # the version names the weights: re-applying it is a no-op for an actuator
            self.version += 1
        self.weights = weights
        return Decision(weights=weights.copy(), target=decided.target, mode=decided.mode,
                        reason=decided.reason, version=self.version, changed=changed,
                        demand_estimate=decided.demand_estimate, shed_rps=decided.shed_rps,
                        inputs_age_s=float(obs.inputs_age_s), held_edges=decided.held_edges,
                        now_s=float(obs.now), stale=stale)

    def step(self, obs: Observation) -> Decision:
        _validate(obs, self.n_edges, self.n_origins, self.stale_after_s)
        zeros = np.zeros(self.n_edges)
        if obs.inputs_age_s > self.stale_after_s:
            why = f"stale inputs: age {obs.inputs_age_s:.0f}s > {self.stale_after_s:.0f}s"
            if self.weights is not None:
                weights, note = self.weights, f"holding version {self.version}"
                # fail static on the stale demand, but never on traffic to an origin that fresh health
                # checks call down while a healthy one is reachable (safety rule 1 holds whatever the inputs)
                if obs.health_age_s is not None and obs.health_age_s <= self.stale_after_s:
                    # where the evacuated share goes: where a plan on the last demand seen has room for it
                    # (the rest of every row stays as it is)
                    last = np.clip(np.nan_to_num(np.asarray(obs.demand, dtype=float)), 0.0, None)
                    plan = solve(last, obs.capacity, obs.latency, obs.healthy, previous=self.weights).weights
                    moved_off = strip_unusable(self.weights, plan, usable_mask(obs.latency, obs.healthy), obs.latency)
                    weights = enforce_safety(self.weights, moved_off, obs.latency, obs.healthy, self.max_step)
                    moved = ((self.weights - weights) > _EPS).any(axis=0)
                    if moved.any():
                        note = (f"holding version {self.version} but moved off {self._names(moved)} "
                                "(unhealthy by fresh health checks)")
                held = Proposal(weights, weights, zeros, Mode.HOLD, f"{why}; {note}", zeros,
                                list(range(self.n_edges)))
                return self._publish(obs, held, stale=True)
            # nothing to hold: nearest healthy origin per edge, from the last known topology
            fallback = solve(zeros, obs.capacity, obs.latency, obs.healthy).weights
            return self._publish(obs, Proposal(fallback, fallback, zeros, Mode.FALLBACK,
                                               f"{why}; no last good weights, nearest healthy "
                                               f"origin", zeros), stale=True)
        proposed = self._propose(obs)
        previous = self.weights if self.weights is not None else proposed.weights
        weights = enforce_safety(previous, proposed.weights, obs.latency, obs.healthy, self.max_step)
        return self._publish(obs, replace(proposed, weights=weights))


def _mode_of(status: str) -> Mode:
    return {"optimal": Mode.NORMAL, "shed": Mode.SHED, "hold": Mode.HOLD,
            "fallback": Mode.FALLBACK}[status]

