"""Optimal edge→origin assignment: a linear program solved by HiGHS (scipy.optimize.linprog,
dual simplex), with column generation so 1000 edges × 100 origins solves in well under a second.

API (stable)::

    solve(demand, capacity, latency, healthy, previous=None, headroom=0.05, stickiness_ms=0.1)
        -> Solution
    greedy(demand, capacity, latency, healthy, previous=None, headroom=0.05) -> Solution

Inputs, E edges × O origins (numpy arrays or nested sequences):

- ``demand[E]``    req/s arriving at each edge (>= 0, at most ``MAX_RATE`` = 1e12; below ``MIN_RATE``
                   = 1e-6 counts as 0)
- ``capacity[O]``  req/s each origin may receive (>= 0, at most ``MAX_RATE``); the solver plans on
                   ``capacity * (1 - headroom)``
- ``latency[E,O]`` edge→origin latency in ms (>= 0, finite at most ``MAX_LATENCY_MS`` = 1e9);
                   ``inf`` (or NaN) = no path
- ``healthy[O]``   origin health
- ``previous[E,O]`` last weights (rows summing to 1), optional: ties are broken toward them, and an
                   edge with nothing usable holds them

Output, :class:`Solution`: ``weights[E,O]`` (every row sums to 1, never all-zero), ``flows[E,O]``
(req/s), ``served``/``shed`` per edge, ``shortfall_rps``, ``served_fraction``, ``objective``
(latency-weighted served traffic, ms·req/s), ``status``, the indices of held/fallback edges and a
``message`` saying what is short (the served fraction, the shortfall, and the edges that reach no
usable origin: nothing is served there, whatever their weights).

The program: variables ``x[e,o] >= 0`` only for reachable, healthy pairs (a sparse matrix, so
1000 × 100 stays small); minimize ``Σ (latency[e,o] + stickiness·(1 - previous[e,o])) · x[e,o]``
subject to ``Σ_o x[e,o] = served[e]`` and ``Σ_e x[e,o] <= capacity[o]·(1-headroom)``. It is
solved on each edge's few nearest origins first; pairs whose reduced cost (from HiGHS' duals) is
negative are added until none is left, which proves the restricted optimum optimal for the whole
problem. The stickiness term is the tie-break toward ``previous``: between origins within
``stickiness_ms`` of each other the current one wins, so equal optima do not flap.

Fairness rule when healthy capacity is short: *proportional shedding* — every edge is served the
same fraction ``t`` of its demand, the largest ``t`` possible (first a small LP maximizes ``t``,
then any capacity left over serves more where it can). With every pair reachable, ``t`` is simply
total capacity / total demand and each origin ends up loaded by the same factor ``1/t``: weights
still route all traffic (a load balancer cannot drop), the shortfall is reported for paging and
rate limiting.

Edges with zero demand get the nearest healthy origin that has room (or hold ``previous`` when it
is still valid), so no edge is ever left all-zero. If an edge reaches no healthy origin it holds
``previous`` (``held``) or, without one, spreads over its reachable origins by capacity
(``fallback``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from opsloop.records.edge import MAX_RATE_RPS, MAX_RESPONSE_MS

ArrayLike = np.ndarray | Sequence[float] | Sequence[Sequence[float]]

# Flows below this (req/s) are solver noise, not decisions.
FLOW_EPSILON = 1e-7
# Demand and capacity below this (req/s) count as zero.
MIN_RATE = 1e-6
# Demand and capacity above this (req/s), and finite latency above MAX_LATENCY_MS, are refused:
# HiGHS takes a bound or cost from 1e20 up as infinite, and a finite 1e308 (an infinite reading
# through np.nan_to_num) failed the solve as "Model error" instead of naming the input
MAX_RATE = MAX_RATE_RPS
MAX_LATENCY_MS = MAX_RESPONSE_MS
# Column generation: cheapest origins per edge in the first restricted LP, and a safety bound.
_START_CANDIDATES = 8
_MAX_PRICING_ROUNDS = 50


class SchedulerError(ValueError):
    """Inputs that cannot describe an assignment problem (the message names the argument)."""


@dataclass
class Solution:
    weights: np.ndarray                 # [E, O] shares, rows sum to 1
    flows: np.ndarray                   # [E, O] req/s planned per pair
    served: np.ndarray                  # [E] req/s planned to be served
    shed: np.ndarray                    # [E] req/s of demand beyond healthy capacity
    # the fraction of the demand served: the common fraction t every edge reaching a usable origin
    # gets (1.0 when nothing is shed); with demand at edges that reach none, served / demand
    served_fraction: float
    objective: float                    # Σ latency · flow over served traffic (ms·req/s)
    status: str                         # "optimal" | "shed" | "hold" | "fallback"
    held_edges: list[int] = field(default_factory=list)      # rows that kept ``previous``
    fallback_edges: list[int] = field(default_factory=list)  # rows with a static fallback
    message: str = ""

    @property
    def shortfall_rps(self) -> float:
        return float(self.shed.sum())


def _first(mask: np.ndarray) -> tuple[int, ...] | None:
    return tuple(int(i) for i in np.argwhere(mask)[0]) if mask.any() else None


def check_finite_nonneg(name: str, values: ArrayLike) -> None:
    """A SchedulerError naming the first entry of ``values`` that is not a finite number >= 0."""
    arr = np.asarray(values, dtype=float)
    idx = _first(~np.isfinite(arr) | (arr < 0))
    if idx is not None:
        raise SchedulerError(f"{name}[{', '.join(map(str, idx))}]: expected a finite number >= 0, "
                             f"got {float(arr[idx])!r}")


def check_at_most(name: str, values: ArrayLike, most: float, unit: str,
                  finite_only: bool = False) -> None:
    """A SchedulerError naming the first entry of ``values`` above ``most`` (+inf included, unless
    ``finite_only``: an infinite latency is no path)."""
    arr = np.asarray(values, dtype=float)
    idx = _first((arr > most) & np.isfinite(arr) if finite_only else arr > most)
    if idx is not None:
        raise SchedulerError(f"{name}[{', '.join(map(str, idx))}]: expected at most {most:g} {unit}, "
                             f"got {float(arr[idx])!r}")


def _as_inputs(demand: ArrayLike, capacity: ArrayLike, latency: ArrayLike, healthy: ArrayLike,
               previous: ArrayLike | None, headroom: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    def array(name: str, value: ArrayLike, ndim: int, dtype: type = float) -> np.ndarray:
        try:
            arr = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise SchedulerError(f"{name}: not a numeric array ({exc})") from None
        if arr.ndim != ndim:
            raise SchedulerError(f"{name}: expected {ndim} dimension(s), got shape {arr.shape}")
        return arr

    d = array("demand", demand, 1)
    c = array("capacity", capacity, 1)
    lat = array("latency", latency, 2)
    h = array("healthy", healthy, 1, bool)
    n_edges, n_origins = len(d), len(c)
    if n_edges == 0 or n_origins == 0:
        raise SchedulerError(f"need at least one edge and one origin, got {n_edges} × {n_origins}")
    if lat.shape != (n_edges, n_origins):
        raise SchedulerError(f"latency: expected shape ({n_edges}, {n_origins}), got {lat.shape}")
    if h.shape != (n_origins,):
        raise SchedulerError(f"healthy: expected shape ({n_origins},), got {h.shape}")
    for name, arr in (("demand", d), ("capacity", c)):
        check_finite_nonneg(name, arr)
        check_at_most(name, arr, MAX_RATE, "req/s")
    lat = np.where(np.isnan(lat), np.inf, lat)
    if (lat < 0).any():
        idx = np.argwhere(lat < 0)[0]
        raise SchedulerError(f"latency[{idx[0]}, {idx[1]}]: expected >= 0 ms, got {float(lat[tuple(idx)])!r}")
    check_at_most("latency", lat, MAX_LATENCY_MS, "ms (inf: no path)", finite_only=True)
    if not (0.0 <= headroom < 1.0):
        raise SchedulerError(f"headroom: expected 0 <= headroom < 1, got {headroom!r}")
    prev = None
    if previous is not None:
        prev = array("previous", previous, 2)
        if prev.shape != (n_edges, n_origins):
            raise SchedulerError(f"previous: expected shape ({n_edges}, {n_origins}), got {prev.shape}")
        if not np.isfinite(prev).all() or (prev < 0).any():
            raise SchedulerError("previous: shares must be finite and >= 0")
    return d, c, lat, h, prev


def _usable_row(prev_row: np.ndarray | None, usable_row: np.ndarray) -> bool:
    """A previous row that still puts traffic only on usable origins."""
    return prev_row is not None and prev_row.sum() > 0 and not (prev_row[~usable_row] > 0).any()


def _normalized(row: np.ndarray) -> np.ndarray:
    return row / row.sum()


def _complete_rows(flows: np.ndarray, demand: np.ndarray, capacity_eff: np.ndarray,
                   latency: np.ndarray, usable: np.ndarray, capacity: np.ndarray,
                   previous: np.ndarray | None) -> tuple[np.ndarray, list[int], list[int]]:
    """Weights from flows; rows without flow (zero demand, no usable origin) get a safe row."""
    n_edges, n_origins = flows.shape
    weights = np.zeros((n_edges, n_origins))
    served = flows.sum(axis=1)
    has_flow = served > FLOW_EPSILON
    weights[has_flow] = flows[has_flow] / served[has_flow, None]
    residual = capacity_eff - flows.sum(axis=0)
    held: list[int] = []
    fallback: list[int] = []
    for e in np.flatnonzero(~has_flow):
        prev_row = previous[e] if previous is not None else None
        if usable[e].any():
            if demand[e] <= FLOW_EPSILON and _usable_row(prev_row, usable[e]):
                weights[e] = _normalized(prev_row)  # idle edge: nothing to improve, don't flap
                continue
            # nearest usable origin with room, else nearest usable
            candidates = usable[e] & (residual > FLOW_EPSILON)
            if not candidates.any():
                candidates = usable[e]
            weights[e, np.argmin(np.where(candidates, latency[e], np.inf))] = 1.0
        elif prev_row is not None and prev_row.sum() > 0:
            weights[e] = _normalized(prev_row)
            held.append(int(e))
        else:
            reach = np.isfinite(latency[e])
            pool = reach if reach.any() else np.ones(n_origins, dtype=bool)
            share = np.where(pool, capacity, 0.0)
            weights[e] = _normalized(share) if share.sum() > 0 else _normalized(pool.astype(float))
            fallback.append(int(e))
    weights = np.clip(weights, 0.0, None)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights, held, fallback


def _max_served_fraction(demand: np.ndarray, capacity_eff: np.ndarray,
                         usable: np.ndarray) -> float:
    """The largest t such that every edge (with a usable origin) can be served t of its demand."""
    needy = usable.any(axis=1) & (demand > FLOW_EPSILON)
    if not needy.any():
        return 1.0
    live = usable.any(axis=0)
    if usable[needy][:, live].all():  # every needy edge reaches every usable origin: closed form
        return float(min(1.0, capacity_eff[live].sum() / demand[needy].sum()))
    rows, cols = np.nonzero(usable & needy[:, None])
    n_var = len(rows)
    # variables: x (pair flows) then t; maximize t
    cost = np.zeros(n_var + 1)
    cost[-1] = -1.0
    edge_idx = np.flatnonzero(needy)
    edge_pos = {int(e): i for i, e in enumerate(edge_idx)}
    served_rows = np.array([edge_pos[int(r)] for r in rows])
    # t*d_e - Σ_o x[e,o] <= 0
    n_needy = len(edge_idx)
    a_served = sp.csr_matrix(
        (np.concatenate([-np.ones(n_var), demand[edge_idx]]),
         (np.concatenate([served_rows, np.arange(n_needy)]),
          np.concatenate([np.arange(n_var), np.full(n_needy, n_var)]))),
        shape=(n_needy, n_var + 1))
    a_cap = sp.csr_matrix((np.ones(n_var), (cols, np.arange(n_var))),
                          shape=(len(capacity_eff), n_var + 1))
    a_ub = sp.vstack([a_served, a_cap]).tocsr()
    b_ub = np.concatenate([np.zeros(n_needy), capacity_eff])
    bounds = [(0, None)] * n_var + [(0, 1)]
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise SchedulerError(f"fairness LP failed: {res.message}")
    return float(min(1.0, max(0.0, res.x[-1])))


def _matrices(rows: np.ndarray, cols: np.ndarray, n_origins: int
              ) -> tuple[np.ndarray, sp.csr_matrix, sp.csr_matrix]:
    n_var = len(rows)
    var_idx = np.arange(n_var)
    edges_used, edge_row = np.unique(rows, return_inverse=True)
    a_edge = sp.csr_matrix((np.ones(n_var), (edge_row, var_idx)), shape=(len(edges_used), n_var))
    a_cap = sp.csr_matrix((np.ones(n_var), (cols, var_idx)), shape=(n_origins, n_var))
    return edges_used, a_edge, a_cap


def _transport(cost: np.ndarray, active: np.ndarray, target: np.ndarray,
               capacity_eff: np.ndarray) -> np.ndarray:
    """min Σ cost·x, Σ_o x = target (per edge), Σ_e x <= capacity (per origin), x >= 0.

    Column generation keeps large instances fast: start from each edge's ``_START_CANDIDATES``
    cheapest origins, solve, and add every left-out pair whose reduced cost ``c - u_e - v_o`` is
    negative (HiGHS' duals) until there is none — then the restricted optimum is the optimum. A
    restricted problem that is infeasible (near origins full) widens the candidate set.
    """
    n_edges, n_origins = cost.shape
    flows = np.zeros((n_edges, n_origins))
    k = min(n_origins, _START_CANDIDATES)
    finite_cost = np.where(active, cost, np.inf)

    def nearest(k: int) -> np.ndarray:
        if k >= n_origins:
            return active.copy()
        mask = np.zeros_like(active)
        idx = np.argpartition(finite_cost, k - 1, axis=1)[:, :k]
        np.put_along_axis(mask, idx, True, axis=1)
        return mask & active

    candidates = nearest(k)
    for _ in range(_MAX_PRICING_ROUNDS):
        rows, cols = np.nonzero(candidates)
        edges_used, a_edge, a_cap = _matrices(rows, cols, n_origins)
        res = linprog(finite_cost[rows, cols], A_ub=a_cap,
                      b_ub=capacity_eff * (1 + 1e-9) + 1e-9, A_eq=a_edge, b_eq=target[edges_used],
                      bounds=(0, None), method="highs-ds")
        if res.status == 2 and not (candidates == active).all():  # infeasible: widen
            k = min(n_origins, 2 * k)
            candidates = nearest(k) | candidates
            continue
        if res.status == 2:
            # infeasible only within solver tolerances (rates near 1e-7): serve what fits instead
            return _transport_with_bonus(cost, active, np.zeros_like(target), target, capacity_eff)
        if res.status != 0:
            raise SchedulerError(f"assignment LP failed: {res.message}")
        u = np.zeros(n_edges)
        u[edges_used] = res.eqlin.marginals
        v = res.ineqlin.marginals
        reduced = finite_cost - u[:, None] - v[None, :]
        improving = active & ~candidates & (reduced < -1e-9 * (1.0 + np.abs(finite_cost)))
        if not improving.any():
            flows[rows, cols] = np.clip(res.x, 0.0, None)
            return flows
        candidates |= improving
    raise SchedulerError("assignment LP: column generation did not converge")


def _transport_with_bonus(cost: np.ndarray, active: np.ndarray, target: np.ndarray,
                          demand: np.ndarray, capacity_eff: np.ndarray) -> np.ndarray:
    """Shortage with partial reach: each edge gets at least its fair ``target``, at most its
    demand; leftover capacity serves more (worth more than any latency difference)."""
    rows, cols = np.nonzero(active)
    edges_used, a_edge, a_cap = _matrices(rows, cols, cost.shape[1])
    c = cost[rows, cols]
    bonus = 2.0 * (float(c.max()) + 1.0)
    a_ub = sp.vstack([a_cap, -a_edge, a_edge]).tocsr()
    b_ub = np.concatenate([capacity_eff * (1 + 1e-9) + 1e-9, -target[edges_used] * (1 - 1e-9),
                           demand[edges_used]])
    res = linprog(c - bonus, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs-ds")
    if res.status != 0:
        raise SchedulerError(f"assignment LP failed: {res.message}")
    flows = np.zeros(cost.shape)
    flows[rows, cols] = np.clip(res.x, 0.0, None)
    return flows


def solve(demand: ArrayLike, capacity: ArrayLike, latency: ArrayLike, healthy: ArrayLike,
          previous: ArrayLike | None = None, headroom: float = 0.05,
          stickiness_ms: float = 0.1) -> Solution:
    """Minimum-latency assignment under capacity and health; see the module docstring."""
    d, cap, lat, ok, prev = _as_inputs(demand, capacity, latency, healthy, previous, headroom)
    n_edges, n_origins = lat.shape
    # rates below MIN_RATE req/s are noise, and near the LP's tolerances: treat them as zero
    d = np.where(d < MIN_RATE, 0.0, d)
    cap = np.where(cap < MIN_RATE, 0.0, cap)
    capacity_eff = cap * (1.0 - headroom)
    usable = np.isfinite(lat) & ok[None, :]
    t = _max_served_fraction(d, capacity_eff, usable)
    target = d * t
    target[~usable.any(axis=1)] = 0.0

    active = usable & (d > FLOW_EPSILON)[:, None]
    cost = np.where(active, lat, np.inf)
    if prev is not None and stickiness_ms > 0:
        cost = cost + stickiness_ms * (1.0 - np.clip(prev, 0.0, 1.0))
    flows = np.zeros((n_edges, n_origins))
    if active.any():
        live = usable.any(axis=0)
        needy = active.any(axis=1)
        if t >= 1.0 - 1e-12 or usable[needy][:, live].all():
            # every edge served exactly t·demand (t=1, or the closed-form proportional case)
            flows = _transport(cost, active, target, capacity_eff)
        else:
            flows = _transport_with_bonus(cost, active, target, d, capacity_eff)
        flows[flows < FLOW_EPSILON] = 0.0
    weights, held, fallback = _complete_rows(flows, d, capacity_eff, lat, usable, cap, prev)
    served = flows.sum(axis=1)
    shed = np.clip(d - served, 0.0, None)
    shed[shed < 1e-6 * max(1.0, float(d.max()))] = 0.0
    status = "optimal"
    if shed.sum() > 0:
        status = "shed"
    if held:
        status = "hold"
    if fallback:
        status = "fallback"
    # an edge with demand but no usable origin is served nothing: t (over the edges that have one)
    # would report it served
    stranded = ~usable.any(axis=1) & (d > 0)
    fraction = t if not stranded.any() else float(served.sum() / d.sum())
    objective = float(np.sum(np.where(flows > 0, lat, 0.0) * flows))
    return Solution(weights=weights, flows=flows, served=served, shed=shed, served_fraction=fraction,
                    objective=objective, status=status, held_edges=held, fallback_edges=fallback,
                    message=_message(status, fraction, shed, d, stranded, ok, held, fallback))


def _message(status: str, fraction: float, shed: np.ndarray, demand: np.ndarray, stranded: np.ndarray,
             healthy: np.ndarray, held: list[int], fallback: list[int]) -> str:
    """What is short, in one line ("" when nothing is)."""
    if status == "optimal":
        return ""
    parts = [f"served fraction {fraction:.3f}, shortfall {shed.sum():.1f} req/s"]
    if not healthy.any():
        parts.append("no healthy origin")
    if stranded.any():
        parts.append(f"nothing served at edge(s) {np.flatnonzero(stranded).tolist()} "
                     f"({demand[stranded].sum():.1f} req/s): no usable origin")
    if held:
        parts.append(f"edge(s) {held} hold their previous weights")
    if fallback:
        parts.append(f"edge(s) {fallback} spread over their reachable origins by capacity")
    return "; ".join(parts)


def greedy(demand: ArrayLike, capacity: ArrayLike, latency: ArrayLike, healthy: ArrayLike,
           previous: ArrayLike | None = None, headroom: float = 0.05) -> Solution:
    """Nearest-first baseline: visit (edge, origin) pairs by increasing latency and give each the
    most it can take. What remains unserved is shed (no fairness)."""
    d, cap, lat, ok, prev = _as_inputs(demand, capacity, latency, healthy, previous, headroom)
    d = np.where(d < MIN_RATE, 0.0, d)
    cap = np.where(cap < MIN_RATE, 0.0, cap)
    capacity_eff = cap * (1.0 - headroom)
    usable = np.isfinite(lat) & ok[None, :]
    rows, cols = np.nonzero(usable)
    order = np.argsort(lat[rows, cols], kind="stable")
    remaining_demand = d.copy()
    remaining_cap = capacity_eff.copy()
    flows = np.zeros(lat.shape)
    for e, o in zip(rows[order].tolist(), cols[order].tolist()):
        amount = min(remaining_demand[e], remaining_cap[o])
        if amount > 0:
            flows[e, o] = amount
            remaining_demand[e] -= amount
            remaining_cap[o] -= amount
    weights, held, fallback = _complete_rows(flows, d, capacity_eff, lat, usable, cap, prev)
    served = flows.sum(axis=1)
    shed = np.clip(d - served, 0.0, None)
    total = float(d.sum())
    objective = float(np.sum(np.where(flows > 0, lat, 0.0) * flows))
    return Solution(weights=weights, flows=flows, served=served, shed=shed,
                    served_fraction=float(served.sum() / total) if total > 0 else 1.0,
                    objective=objective, status="shed" if shed.sum() > 1e-9 else "optimal",
                    held_edges=held, fallback_edges=fallback)
