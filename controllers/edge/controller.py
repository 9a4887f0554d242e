"""Edge-weight controllers: turn the optimal assignment into the weights pushed each interval.

The loop (seed 003): edges report their request rate every interval; we push weights; clients
react to the latency those weights cause (a far origin lowers their request rate) and origins slow
down when overloaded. The seed's controller moved at most 2 % per origin per 15 s interval: stable,
but minutes to move 30 % of traffic; undamped, it oscillated.

Control law of :class:`EdgeController` (one step per interval k, weights ``W`` per edge × origin)
--------------------------------------------------------------------------------------------------
1. *Demand estimate* ``D̂ = max(measured rate over the last N intervals)`` (N = ``demand_window``,
   default 2), and never below what the last relax step predicted for the weights now in force
   (the last interval's average still holds the clients' transient): a rise is seen at once, a
   fall only after N intervals (robust to noise and to the dip that shedding itself causes).
2. *Target* ``T = solve(D̂, capacity, latency, healthy, previous=W, headroom=h)``: the optimal
   assignment planned on ``capacity·(1-h)`` (h = 5 %).
3. *Shed fast.* An origin is *hot* when its planned load at the current weights, ``Σ_e W·D̂``,
   exceeds its capacity by more than ``hot_margin`` (default 3 %, for measurement noise; the
   target is capacity + 5 %). Then the target is re-planned with the deeper ``shed_headroom``
   (default 10 %) and every decrease of ``T`` on a hot origin is applied in one step (the freed
   share going where ``T`` increases, within ``max_step``): safety first. An origin above
   capacity but within the margin is *warm*: a ``relax_gain`` fraction of its decrease is applied
   per interval (noise there must not cause big swings).
4. *Relax slowly and safely.* The rest of the move ``T - W`` is applied as ``β·(T - W)`` with
   ``β ≤ relax_gain`` (0.5), ``β·|T - W|∞ ≤ relax_step`` (0.2), and β the largest value for which
   every origin's *predicted* load stays ``≤ capacity·(1-h)``. The prediction assumes worst-case
   latency-elastic clients: an edge's demand grows as ``D̂·(L(W)/L(V))^ε`` when its mean latency
   falls from ``L(W)`` to ``L(V)`` (ε = ``elasticity``, default 1: closed-loop clients whose rate
   is inversely proportional to latency, the most elastic a request/response client can be).
   Hysteresis: when nothing is hot or warm, a relax move is only made if it lowers the
   latency-weighted traffic (toward nearer origins); an origin between its plan and its capacity
   is left alone.
5. *Final guard* (:func:`enforce_safety`, also applied to the seed's controller): shares off an
   unhealthy or unreachable origin move at once (first to where the target wants more); any other
   change is bounded by ``max_step`` (0.5) per origin per interval; rows are convex combinations of
   valid rows, so they sum to 1, are never all-zero and put nothing on an unhealthy origin while a
   healthy one is reachable. Stale inputs (``inputs_age_s > stale_after_s``, 30 s) hold the last
   good weights and say so (``mode=hold``, ``reason``).

Why it is stable (no sustained oscillation, overshoot within the 5 % band)
--------------------------------------------------------------------------
* The shed step moves traffic from a hot origin to the next-best ones, which are farther, so the
  clients' network latency rises and their demand falls: after the step every origin's load is
  at most what the LP planned at ``D̂`` (≥ the actual demand). The one effect that can push demand
  back up is the relieved origin answering faster than it did while overloaded; the deeper shed
  headroom (10 % vs 5 %) absorbs that rebound, so one step suffices. A step first seen only
  partially (it happened mid-interval) is complete in the next interval's estimate: every origin
  is within capacity after 1–2 intervals (3 if a shed larger than ``max_step`` is needed).
* A relax step is chosen so that even the most elastic clients cannot push any origin above
  ``capacity·(1-h)``; real clients are at most that elastic, so relaxing never makes an origin
  hot. Hence the loop cannot alternate between shedding and relaxing (the limit cycle of the
  undamped seed controller): after an exogenous step there is at most one shed phase, followed by
  an approach from the safe side. Each relax step closes a fixed fraction of the remaining
  predicted gap (0 < β ≤ relax_gain < 1): a contraction, geometric and monotone for one edge.
  The undamped fixed-point iteration ``W ← T(D(W))`` diverges exactly when ``|∂T/∂W| > 1``, i.e.
  when demand elasticity times the latency gap outweighs the share (``w·ε·(L_far - L_near)/L >
  1``; 1.3 in the seed experiment); the worst-case prediction removes that factor from the step.
* Noise: the gap between plan (95 %) and hot (103 %) is a dead band wider than the measurement
  noise, and moves smaller than ``deadband`` are skipped, so noise does not dither the weights.
* Limits (what the simulator shows): with several edges the LP target itself moves as the demand
  estimates move, so a multi-origin reshuffle converges over several intervals rather than
  strictly monotonically; the guarantee that holds is the one that matters for safety — relaxing
  never pushes an origin over capacity.

:class:`FixedStepController` is the seed's law for comparison (target from the same LP, every
origin's share moved at most ``step`` = 2 % per interval); :class:`UndampedController` applies the
target at once (the seed's first version, which never settled).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controllers.edge.model import EdgeWeights, Mode
from controllers.edge.scheduler import solve

_EPS = 1e-12


class ControllerSettings(BaseModel):
    """Tunables of :class:`EdgeController` (seconds, shares in [0, 1])."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=15.0, gt=0)
    headroom: float = Field(default=0.05, ge=0.0, lt=0.5)
    max_step: float = Field(default=0.5, gt=0.0, le=1.0)
    relax_gain: float = Field(default=0.5, gt=0.0, le=1.0)
    relax_step: float = Field(default=0.2, gt=0.0, le=1.0)
    demand_window: int = Field(default=2, ge=1, le=100)
    elasticity: float = Field(default=1.0, ge=0.0, le=4.0)
    latency_floor_ms: float = Field(default=10.0, ge=0.0)
    stale_after_s: float = Field(default=30.0, gt=0.0)
    stickiness_ms: float = Field(default=0.1, ge=0.0)
    deadband: float = Field(default=0.005, ge=0.0, lt=0.5)
    hot_margin: float = Field(default=0.03, ge=0.0, le=0.05)
    shed_headroom: float = Field(default=0.10, ge=0.0, lt=0.5)

    @model_validator(mode="after")
    def _steps(self) -> "ControllerSettings":
        if self.relax_step > self.max_step:
            raise ValueError(f"relax_step: must not exceed max_step ({self.max_step!r}), "
                             f"got {self.relax_step!r}")
        return self


class FixedStepSettings(BaseModel):
    """Tunables of :class:`FixedStepController` (the seed used 2 % per 15 s, no headroom)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=15.0, gt=0)
    step: float = Field(default=0.02, gt=0.0, le=1.0)
    headroom: float = Field(default=0.0, ge=0.0, lt=0.5)
    stale_after_s: float = Field(default=45.0, gt=0.0)


@dataclass
class Observation:
    """What the controller sees at one tick (arrays: edges × origins in a fixed order)."""

    now: float
    demand: np.ndarray          # [E] measured req/s over the last interval
    capacity: np.ndarray        # [O] req/s
    latency: np.ndarray         # [E, O] ms, inf = no path
    healthy: np.ndarray         # [O] bool
    inputs_age_s: float = 0.0   # age of the oldest input this decision relies on


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


def usable_mask(latency: np.ndarray, healthy: np.ndarray) -> np.ndarray:
    """[E, O]: origin healthy and reachable from the edge."""
    return np.isfinite(latency) & np.asarray(healthy, dtype=bool)[None, :]


def _nearest_rows(latency: np.ndarray, usable: np.ndarray) -> np.ndarray:
    rows = np.zeros(latency.shape)
    has = usable.any(axis=1)
    idx = np.argmin(np.where(usable, latency, np.inf), axis=1)
    rows[np.flatnonzero(has), idx[has]] = 1.0
    return rows


def strip_unusable(previous: np.ndarray, proposal: np.ndarray, usable: np.ndarray,
                   latency: np.ndarray) -> np.ndarray:
    """Move every share on an unusable origin at once to the usable ones: first where
    ``proposal`` wants more than the row has, in proportion to that shortfall, the rest as
    ``proposal`` splits the row (else to the nearest). Rows with no usable origin are left as they
    are (fail static)."""
    out = np.array(previous, dtype=float, copy=True)
    has_usable = usable.any(axis=1)
    bad = ~usable & (out > 0) & has_usable[:, None]
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size == 0:
        return out
    dest = np.where(usable, np.clip(proposal, 0.0, None), 0.0)
    empty = dest.sum(axis=1) <= _EPS
    dest[empty] = _nearest_rows(latency, usable)[empty]
    dest /= np.where(dest.sum(axis=1, keepdims=True) > 0, dest.sum(axis=1, keepdims=True), 1.0)
    mass = np.where(bad, out, 0.0).sum(axis=1)
    out[bad] = 0.0
    # fill the proposal's shortfalls first, so the evacuated share lands where it is wanted
    shortfall = np.where(usable, np.clip(dest - out, 0.0, None), 0.0)
    short_total = shortfall.sum(axis=1)
    to_fill = np.minimum(mass, short_total)
    scale = np.divide(to_fill, short_total, out=np.zeros_like(to_fill), where=short_total > _EPS)
    out[rows] += shortfall[rows] * scale[rows, None]
    out[rows] += (mass - to_fill)[rows, None] * dest[rows]
    return out


def enforce_safety(previous: np.ndarray, proposal: np.ndarray, latency: np.ndarray,
                   healthy: np.ndarray, max_step: float) -> np.ndarray:
    """The final guard, whatever the proposal: see rule 5 in the module docstring.

    Returns rows that sum to 1, are never all-zero, have nothing on an unusable origin when a usable
    one exists, and differ from ``previous`` by at most ``max_step`` per origin except for the share
    moved off unusable origins.
    """
    prev = np.clip(np.nan_to_num(np.asarray(previous, dtype=float)), 0.0, None)
    prop = np.clip(np.nan_to_num(np.asarray(proposal, dtype=float)), 0.0, None)
    usable = usable_mask(latency, healthy)
    has_usable = usable.any(axis=1)
    nearest = _nearest_rows(latency, usable)
    # a previous row that is all-zero is not a decision: start from the nearest usable origin
    prev_empty = prev.sum(axis=1) <= _EPS
    prev[prev_empty & has_usable] = nearest[prev_empty & has_usable]
    prev[prev_empty & ~has_usable] = 1.0
    prev /= prev.sum(axis=1, keepdims=True)

    prop = np.where(usable, prop, 0.0)
    base = strip_unusable(prev, prop, usable, latency)
    # an empty proposal, or a row with no usable origin, holds (the stripped) previous weights
    prop_empty = (prop.sum(axis=1) <= _EPS) | ~has_usable
    prop[prop_empty] = base[prop_empty]
    prop /= prop.sum(axis=1, keepdims=True)
    delta = prop - base
    biggest = np.abs(delta).max(axis=1)
    alpha = np.where(biggest > max_step, max_step / np.maximum(biggest, _EPS), 1.0)
    out = base + alpha[:, None] * delta
    out = np.clip(out, 0.0, None)
    out[~usable & has_usable[:, None]] = 0.0
    return out / out.sum(axis=1, keepdims=True)


def _validate(obs: Observation, n_edges: int, n_origins: int) -> None:
    if np.shape(obs.demand) != (n_edges,) or np.shape(obs.capacity) != (n_origins,) \
            or np.shape(obs.latency) != (n_edges, n_origins) or np.shape(obs.healthy) != (n_origins,):
        raise ValueError(f"observation: expected shapes demand ({n_edges},), capacity ({n_origins},), "
                         f"latency ({n_edges}, {n_origins}), healthy ({n_origins},); got "
                         f"{np.shape(obs.demand)}, {np.shape(obs.capacity)}, "
                         f"{np.shape(obs.latency)}, {np.shape(obs.healthy)}")
    if not np.isfinite(obs.inputs_age_s) or obs.inputs_age_s < 0:
        raise ValueError(f"observation.inputs_age_s: expected a finite number >= 0, "
                         f"got {obs.inputs_age_s!r}")


class _Controller:
    """State and bookkeeping shared by the controllers: last weights, version, fail-static."""

    name = "base"

    def __init__(self, n_edges: int, n_origins: int, stale_after_s: float, max_step: float,
                 initial: np.ndarray | None = None) -> None:
        self.n_edges = n_edges
        self.n_origins = n_origins
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

    def _propose(self, obs: Observation) -> tuple[np.ndarray, np.ndarray, np.ndarray, Mode, str,
                                                  np.ndarray, list[int]]:
        raise NotImplementedError

    def _publish(self, obs: Observation, weights: np.ndarray, target: np.ndarray, mode: Mode,
                 reason: str, demand_estimate: np.ndarray, shed: np.ndarray,
                 held: list[int], stale: bool = False) -> Decision:
        changed = self.weights is None or not np.allclose(weights, self.weights, atol=1e-9, rtol=0)
        if changed:  # the version names the weights: re-applying it is a no-op for an actuator
            self.version += 1
        self.weights = weights
        return Decision(weights=weights.copy(), target=target, mode=mode, reason=reason,
                        version=self.version, changed=changed, demand_estimate=demand_estimate,
                        shed_rps=shed, inputs_age_s=float(obs.inputs_age_s), held_edges=held,
                        now_s=float(obs.now), stale=stale)

    def step(self, obs: Observation) -> Decision:
        _validate(obs, self.n_edges, self.n_origins)
        zeros = np.zeros(self.n_edges)
        if obs.inputs_age_s > self.stale_after_s:
            why = f"stale inputs: age {obs.inputs_age_s:.0f}s > {self.stale_after_s:.0f}s"
            if self.weights is not None:
                return self._publish(obs, self.weights, self.weights, Mode.HOLD,
                                     f"{why}; holding version {self.version}", zeros, zeros,
                                     list(range(self.n_edges)), stale=True)
            # nothing to hold: nearest healthy origin per edge, from the last known topology
            fallback = solve(zeros, obs.capacity, obs.latency, obs.healthy).weights
            return self._publish(obs, fallback, fallback, Mode.FALLBACK,
                                 f"{why}; no last good weights, nearest healthy origin", zeros,
                                 zeros, [], stale=True)
        proposal, target, estimate, mode, reason, shed, held = self._propose(obs)
        previous = self.weights if self.weights is not None else proposal
        weights = enforce_safety(previous, proposal, obs.latency, obs.healthy, self.max_step)
        return self._publish(obs, weights, target, mode, reason, estimate, shed, held)


def _mode_of(status: str) -> Mode:
    return {"optimal": Mode.NORMAL, "shed": Mode.SHED, "hold": Mode.HOLD,
            "fallback": Mode.FALLBACK}[status]


class EdgeController(_Controller):
    """Our controller: shed at once, relax with a worst-case-elastic prediction (module docstring)."""

    name = "ours"

    def __init__(self, n_edges: int, n_origins: int, settings: ControllerSettings | None = None,
                 initial: np.ndarray | None = None) -> None:
        self.settings = settings or ControllerSettings()
        super().__init__(n_edges, n_origins, self.settings.stale_after_s, self.settings.max_step,
                         initial)
        self._demand_history: deque[np.ndarray] = deque(maxlen=self.settings.demand_window)
        self._predicted_demand: np.ndarray | None = None

    def _mean_latency(self, weights: np.ndarray, latency: np.ndarray) -> np.ndarray:
        finite = np.where(np.isfinite(latency), latency, 0.0)
        return (weights * finite).sum(axis=1) + self.settings.latency_floor_ms

    def _predicted_demand_at(self, weights: np.ndarray, demand: np.ndarray,
                             latency_now: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """Worst-case demand at ``weights``: grows as latency falls, never assumed to fall."""
        growth = np.maximum(1.0, latency_now / np.maximum(self._mean_latency(weights, latency), _EPS))
        return demand * growth ** self.settings.elasticity

    def _predicted_load(self, weights: np.ndarray, demand: np.ndarray, latency_now: np.ndarray,
                        latency: np.ndarray) -> np.ndarray:
        predicted = self._predicted_demand_at(weights, demand, latency_now, latency)
        return (weights * predicted[:, None]).sum(axis=0)

    def _propose(self, obs: Observation):  # type: ignore[override]
        s = self.settings
        measured = np.clip(np.nan_to_num(np.asarray(obs.demand, dtype=float)), 0.0, None)
        self._demand_history.append(measured)
        estimate = np.max(np.stack(self._demand_history), axis=0)
        if self._predicted_demand is not None:
            # the last interval's average still contains the clients' transient after our last
            # move: never plan below what we predicted for the weights now in force
            estimate = np.maximum(estimate, self._predicted_demand)
        self._predicted_demand = None
        capacity = np.asarray(obs.capacity, dtype=float)
        latency = np.asarray(obs.latency, dtype=float)
        healthy = np.asarray(obs.healthy, dtype=bool)
        solution = solve(estimate, capacity, latency, healthy, previous=self.weights,
                         headroom=s.headroom, stickiness_ms=s.stickiness_ms)
        target = solution.weights
        mode = _mode_of(solution.status)
        if self.weights is None:  # first decision: nothing to damp against
            return (target, target, estimate, mode, f"initial assignment ({solution.status})",
                    solution.shed, solution.held_edges)

        usable = usable_mask(latency, healthy)
        current = strip_unusable(self.weights, target, usable, latency)
        cap_plan = capacity * (1.0 - s.headroom)
        load = (current * estimate[:, None]).sum(axis=0)
        hot = healthy & (load > capacity * (1 + s.hot_margin) + 1e-9)
        if hot.any() and s.shed_headroom > s.headroom:
            # shed deeper than the plan: clients of a relieved origin speed up (its overload
            # latency goes away) and come back with more requests; relaxing climbs back later
            deeper = solve(estimate, capacity, latency, healthy, previous=self.weights,
                           headroom=s.shed_headroom, stickiness_ms=s.stickiness_ms)
            target = deeper.weights
        delta = target - current

        # shed part: every decrease on a hot origin at once, on a warm one (above capacity, within
        # the hot margin) a relax_gain fraction of it; the freed share spread over the increases
        warm = healthy & ~hot & (load > capacity + 1e-9)
        gain = np.where(hot, 1.0, np.where(warm, s.relax_gain, 0.0))
        cut = np.where(delta < 0, -delta * gain[None, :], 0.0)
        rise = np.clip(delta, 0.0, None)
        rise_total = rise.sum(axis=1)
        freed = cut.sum(axis=1)
        spread = np.divide(freed, rise_total, out=np.zeros_like(freed), where=rise_total > _EPS)
        shed_move = -cut + rise * spread[:, None]
        after_shed = current + shed_move
        relax = delta - shed_move

        beta = 0.0
        limited = False
        biggest = float(np.abs(relax).max()) if relax.size else 0.0
        finite_latency = np.where(np.isfinite(latency), latency, 0.0)
        latency_gain = float((estimate[:, None] * relax * finite_latency).sum())
        # hysteresis: an origin between its plan (capacity·(1-h)) and its capacity is left alone;
        # only moves that lower latency (toward nearer origins) are worth making when nothing is hot
        if biggest > s.deadband and latency_gain < 0:
            beta_max = min(s.relax_gain, s.relax_step / biggest)
            latency_now = self._mean_latency(self.weights, latency)
            ceiling = np.maximum(cap_plan, self._predicted_load(after_shed, estimate, latency_now,
                                                                latency))

            def fits(b: float) -> bool:
                trial = after_shed + b * relax
                pred = self._predicted_load(trial, estimate, latency_now, latency)
                return bool((pred[healthy] <= ceiling[healthy] * (1 + 1e-9) + 1e-9).all())

            beta_full = min(1.0, s.relax_step / biggest)
            if biggest * (1.0 - beta_max) < s.deadband and fits(beta_full):
                beta = beta_full  # close in: finish the move instead of leaving slivers behind
            elif fits(beta_max):
                beta = beta_max
            else:  # bisection for the largest step that keeps the prediction under the ceiling
                limited = True
                lo, hi = 0.0, beta_max
                for _ in range(30):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
                beta = lo
            if beta * biggest < s.deadband:
                beta = 0.0
        proposal = after_shed + beta * relax
        if beta > 0:
            self._predicted_demand = self._predicted_demand_at(
                proposal, estimate, self._mean_latency(self.weights, latency), latency)

        parts = []
        if warm.any():
            names = ", ".join(f"#{o} {load[o]:.0f}/{capacity[o]:.0f} req/s" for o in np.flatnonzero(warm))
            parts.append(f"easing off origin(s) above capacity {names}")
        if hot.any():
            names = ", ".join(f"#{o} {load[o]:.0f}/{capacity[o]:.0f} req/s" for o in np.flatnonzero(hot))
            parts.append(f"shed off overloaded origin(s) {names}")
        if beta > 0:
            parts.append(f"relax toward target, step {beta:.2f} of the gap")
        if not parts:
            parts.append("holding: a further relax step would risk overload" if limited
                         else "at target")
        if solution.status != "optimal":
            parts.append(solution.message)
        return (proposal, target, estimate, mode, "; ".join(parts), solution.shed,
                solution.held_edges)


class _LPTargetController(_Controller):
    """The seed's controllers: the LP target on the measured demand, then their own way of pushing it."""

    def __init__(self, n_edges: int, n_origins: int, settings: FixedStepSettings | None = None,
                 initial: np.ndarray | None = None) -> None:
        self.settings = settings or FixedStepSettings()
        super().__init__(n_edges, n_origins, self.settings.stale_after_s, 1.0, initial)

    def _lp_target(self, obs: Observation):  # noqa: ANN202 - (estimate, Solution)
        estimate = np.clip(np.nan_to_num(np.asarray(obs.demand, dtype=float)), 0.0, None)
        return estimate, solve(estimate, obs.capacity, obs.latency, obs.healthy, previous=self.weights,
                               headroom=self.settings.headroom)


class FixedStepController(_LPTargetController):
    """The seed's controller: same LP target, each origin's share moved ≤ ``step`` per interval."""

    name = "fixed-step"

    def _propose(self, obs: Observation):  # type: ignore[override]
        estimate, solution = self._lp_target(obs)
        target = solution.weights
        if self.weights is None:
            proposal = target
        else:
            current = strip_unusable(self.weights, target, usable_mask(obs.latency, obs.healthy),
                                     obs.latency)
            delta = target - current
            biggest = np.abs(delta).max(axis=1, keepdims=True)
            proposal = current + delta * np.minimum(1.0, self.settings.step / np.maximum(biggest, _EPS))
        return (proposal, target, estimate, _mode_of(solution.status),
                f"damped {self.settings.step:.0%} per origin per interval", solution.shed,
                solution.held_edges)


class UndampedController(_LPTargetController):
    """The seed's first version: push the LP target every interval (oscillates with elastic demand)."""

    name = "undamped"

    def _propose(self, obs: Observation):  # type: ignore[override]
        estimate, solution = self._lp_target(obs)
        return (solution.weights, solution.weights, estimate, _mode_of(solution.status),
                "target applied undamped", solution.shed, solution.held_edges)
