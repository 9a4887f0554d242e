"""Figures of one simulated run, per phase and over the whole run.

Metrics per controller and phase (a phase starts at t=0 and at each plant-changing event), with
``tol`` = ``targets.tolerance``:

- ``time_to_capacity_s``: from the phase start until every healthy origin stays ≤ capacity·(1+tol)
  (None: still above at the end of the phase);
- ``overshoot``: once the controller has acted (its first tick in the phase) and every origin
  has stayed within capacity·(1+tol) for a whole interval, the highest later load above capacity,
  as a fraction of capacity (None: never settled so);
- ``settle_s``: until the weights stay within ``settle_band`` of the phase's final weights (None:
  still moving by more than the band in the last ``steady_intervals``);
- ``oscillation_weight`` / ``oscillation_load``: peak-to-peak of each origin's share of the
  listener's traffic (the edges' weights weighted by their request rates) / of per-interval
  origin load over capacity, over the phase's last ``steady_intervals`` intervals, counting only
  series that change direction there (a monotone approach is convergence, not oscillation);
- ``overload_s``: seconds each origin spent above its capacity;
- ``overshoot_p95``, ``churn``: the 95th percentile of that excess, the traffic share moved per tick
  (in the whole-run figure, less what had to leave an origin the controller saw unhealthy).

At a sample whose load exceeds all healthy capacity (a shortfall, or a noisy draw above it) the band is
the common overload factor (total load / total capacity) × (1+tol), not capacity; so where the edges confined
to some origins (by their paths and health) send more than those origins' capacity, with the least factor
any weights could reach there. Whole run: ``excess_p95``
and ``churn`` outside the transients after a step (the first ``capacity_within_intervals`` of a
phase long enough to be judged on its own; for ``excess_p95`` also the dead time from any change to
the first tick after it), ``judged_overload_s`` (seconds × origins above the
band after the first tick following a change: before it no controller can have reacted),
``mean_latency_feasible_ms`` (outside shortfalls), requests served within capacity.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opsloop.controllers.edge.sim.plant import Run, latency_matrix
from opsloop.controllers.edge.sim.scenario import Scenario


MAX_REACH_SETS = 4096   # origin sets examined per health state: a bound from fewer is still a bound


def _reach_bound(scn: Scenario, run: Run) -> np.ndarray:
    """Per sample, the least overload factor any weights could reach given which origins each edge reaches
    (a path and health): the largest demand of the edges confined to a set of origins over that set's
    capacity (Hall). An edge reaching only a small origin makes a shortfall that the listener's total capacity
    hides: judged against capacity, it was "missed" by every controller alike."""
    if run.reach_bound is not None:
        return run.reach_bound
    bound = np.zeros(len(run.times))
    latency = latency_matrix(scn)
    edges, origins = [e.name for e in scn.edges], [o.name for o in scn.origins]
    changes = sorted((ev for ev in scn.events if ev.latency), key=lambda ev: ev.at)
    start = 0
    for k in range(len(changes) + 1):
        # the plant applies an event at the first step whose end is past it
        end = len(run.times) if k == len(changes) else int(np.searchsorted(run.times, changes[k].at + 1e-9))
        if end > start:
            reach = np.isfinite(latency)
            states, which = np.unique(run.healthy[start:end], axis=0, return_inverse=True)
            for s, healthy in enumerate(states):
                idx = start + np.flatnonzero(which.reshape(-1) == s)
                usable = reach & healthy[None, :]
                sets: set[tuple[bool, ...]] = set()
                for row in {tuple(r) for r in usable if r.any()}:
                    if len(sets) >= MAX_REACH_SETS:
                        break
                    sets |= {row} | {tuple(a or b for a, b in zip(row, t)) for t in sets}
                for t in sets:
                    mask = np.array(t)
                    confined = (usable.any(axis=1) & ~(usable & ~mask[None, :]).any(axis=1)).astype(float)
                    demand = run.rates[idx] @ confined
                    cap = run.capacity[idx] @ mask.astype(float)
                    bound[idx] = np.maximum(bound[idx], demand / np.maximum(cap, 1e-9))
        if k < len(changes):
            for edge, row in (changes[k].latency or {}).items():
                for origin, ms in row.items():
                    latency[edges.index(edge), origins.index(origin)] = ms
            start = max(start, end)
    run.reach_bound = bound
    return bound


def phase_bounds(scn: Scenario) -> list[tuple[float, float, str]]:
    starts = [(0.0, "start")]
    for ev in sorted(scn.events, key=lambda e: e.at):
        if ev.changes_plant:
            label = ev.label or f"event at {ev.at:g}s"
            if starts and abs(starts[-1][0] - ev.at) < 1e-9:
                starts[-1] = (ev.at, f"{starts[-1][1]} + {label}" if ev.at > 0 else label)
            else:
                starts.append((ev.at, label))
    bounds = []
    for idx, (t0, label) in enumerate(starts):
        t1 = starts[idx + 1][0] if idx + 1 < len(starts) else scn.duration_s
        if t1 > t0:
            bounds.append((t0, t1, label))
    return bounds


def _oscillation(series: np.ndarray, eps: float = 1e-6) -> float:
    """Peak-to-peak of the series (time first) that reverse direction; a monotone approach to a
    final value is convergence, not oscillation, and counts 0."""
    if len(series) < 3:
        return 0.0
    flat = series.reshape(len(series), -1)
    steps = np.diff(flat, axis=0)
    reverses = (steps > eps).any(axis=0) & (steps < -eps).any(axis=0)
    if not reverses.any():
        return 0.0
    span = flat.max(axis=0) - flat.min(axis=0)
    return float(span[reverses].max())


def phase_metrics(scn: Scenario, run: Run, t0: float, t1: float) -> dict[str, Any]:
    tg = scn.targets
    in_phase = (run.times > t0 + 1e-9) & (run.times <= t1 + 1e-9)
    times = run.times[in_phase]
    loads = run.loads[in_phase]
    caps = run.capacity[in_phase]
    healthy = run.healthy[in_phase]
    # load over capacity; a (near-)zero capacity with load is simply "far over" (1e6), not inf
    ratio = np.where(caps > 1e-9, loads / np.maximum(caps, 1e-9), np.where(loads > 1e-9, 1e6, 0.0))
    ratio = np.where(healthy, ratio, 0.0)
    total_rate = run.rates[in_phase].sum(axis=1)
    healthy_cap = np.where(healthy, caps, 0.0).sum(axis=1)
    reach = _reach_bound(scn, run)[in_phase]
    feasible = bool(len(total_rate) == 0 or (total_rate[-1] <= healthy_cap[-1] * (1 + 1e-9)
                                             and reach[-1] <= 1 + 1e-9))
    # demand above all healthy capacity: judged against the common overload factor (every origin
    # loaded alike is the fair share of the shortfall), not against capacity. Sample by sample, not
    # only in a phase short at its end: with noisy demand near capacity, an origin's unavoidable
    # excess was judged or forgiven by whether the phase's last draw happened to be above it
    common = np.maximum(np.maximum(1.0, loads.sum(axis=1) / np.maximum(healthy_cap, 1e-9)), reach)
    judged = ratio / common[:, None] if len(ratio) else ratio
    worst = judged.max(axis=1) if len(judged) else np.zeros(0)
    steady_s = tg.steady_intervals * scn.interval_s
    over = worst > 1.0 + tg.tolerance + 1e-9
    if not over.any():
        to_cap: float | None = 0.0
    elif times[np.flatnonzero(over)[-1]] > t1 - scn.interval_s:
        to_cap = None  # still above capacity in the phase's last interval
    else:
        to_cap = float(times[np.flatnonzero(over)[-1]] - t0)
    # overshoot: once the controller has acted on the change (its first tick in the phase) and
    # every origin has stayed within capacity·(1+tol) for a whole interval, how far above
    # capacity does load go again
    first_tick = t0 + scn.interval_s - (t0 % scn.interval_s)
    per_tick = int(round(scn.interval_s / scn.dt_s))
    overshoot: float | None = None
    overshoot_p95: float | None = None
    run_ok = 0
    for idx in range(len(times)):
        run_ok = run_ok + 1 if not over[idx] and times[idx] > first_tick + 1e-9 else 0
        if run_ok >= per_tick:
            after = worst[idx - per_tick + 1:]
            overshoot = float(max(0.0, after.max() - 1.0))
            overshoot_p95 = float(max(0.0, np.quantile(after, 0.95) - 1.0))
            break
    # weights: ticks inside the phase (weights in force after each tick)
    tick_in = (run.tick_times > t0 + 1e-9) & (run.tick_times <= t1 + 1e-9)
    in_force = int(np.sum(run.tick_times <= t0 + 1e-9))  # row of tick_weights in force at t0
    weights = np.concatenate([run.tick_weights[in_force:in_force + 1],
                              run.tick_weights[1:][tick_in]])
    tick_t = np.concatenate([[t0], run.tick_times[tick_in]])
    # the listener's traffic share per origin at each tick (weights weighted by edge request
    # rates): an edge carrying 1 % of the traffic swinging its weights is not an oscillation
    tick_idx = np.clip(np.round(tick_t / scn.dt_s).astype(int) - 1, 0, len(run.times) - 1)
    rates = run.rates[tick_idx]
    traffic = np.einsum("ke,keo->ko", rates, weights) / np.maximum(rates.sum(axis=1), 1e-9)[:, None]
    settle: float | None = 0.0
    osc_w = 0.0
    if len(weights):
        final = weights[-1]
        osc_w = _oscillation(traffic[tick_t > t1 - steady_s - 1e-9])
        away = np.abs(weights - final).max(axis=(1, 2)) > tg.settle_band
        if osc_w > tg.settle_band:
            settle = None
        elif away.any():
            settle = float(tick_t[np.flatnonzero(away)[-1] + 1] - t0) \
                if np.flatnonzero(away)[-1] + 1 < len(tick_t) else None
    # per-interval mean load over capacity in the steady window
    tail = ratio[times > t1 - steady_s - 1e-9]
    n_full = len(tail) // per_tick
    osc_l = 0.0
    if n_full >= 2:
        means = tail[-n_full * per_tick:].reshape(n_full, per_tick, -1).mean(axis=1)
        osc_l = _oscillation(np.where(np.isfinite(means), means, 0.0))
    overload = ((ratio > 1.0 + 1e-9) * scn.dt_s).sum(axis=0)
    moved = 0.5 * np.abs(np.diff(traffic, axis=0)).sum(axis=1) if len(traffic) > 1 else np.zeros(0)
    return {"time_to_capacity_s": to_cap, "overshoot": overshoot, "overshoot_p95": overshoot_p95,
            "settle_s": settle, "oscillation_weight": osc_w, "oscillation_load": osc_l,
            "churn": float(moved.mean()) if len(moved) else 0.0,
            "overload_s": {o.name: float(v) for o, v in zip(scn.origins, overload)},
            "feasible": feasible,
            # request-weighted latency sums, so a comparison can take the same phases of two runs
            "request_ms": float((run.latency[in_phase] * run.rates[in_phase]).sum() * scn.dt_s),
            "requests": float(run.rates[in_phase].sum() * scn.dt_s)}


def common_feasible_latency(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """Mean latency of two runs' summaries over the phases both ran outside a shortfall. Each
    run's own feasible phases differ where one relieved the origins (clients moved to a far origin
    slow down, and the shortfall is gone) and the other kept them overloaded: ours was then judged
    on the far-moved clients against the baseline's pre-surge start alone (1.90x)."""
    both = [(p["metrics"], q["metrics"]) for p, q in zip(a["phases"], b["phases"])
            if p["metrics"]["feasible"] and q["metrics"]["feasible"]]

    def mean(ms: list[dict[str, Any]]) -> float:
        return sum(m["request_ms"] for m in ms) / max(sum(m["requests"] for m in ms), 1e-9) \
            if ms else 0.0
    return mean([p for p, _ in both]), mean([q for _, q in both])


def long_enough(scn: Scenario, ph: dict[str, Any]) -> bool:
    """A phase that lasts past the settling allowance plus one interval is judged on its own; a
    shorter one (a flap every interval, a noise draw) is judged by the run's excess quantile."""
    limit = scn.targets.capacity_within_intervals * scn.interval_s
    return ph["end_s"] - ph["start_s"] >= limit + scn.interval_s - 1e-9


def run_metrics(scn: Scenario, run: Run, phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Whole-run figures: excess quantile outside step transients, churn, requests within capacity."""
    limit = scn.targets.capacity_within_intervals * scn.interval_s
    ratio = np.where(run.capacity > 1e-9, run.loads / np.maximum(run.capacity, 1e-9),
                     np.where(run.loads > 1e-9, 1e6, 0.0))
    ratio = np.where(run.healthy, ratio, 0.0)
    healthy_cap = np.where(run.healthy, run.capacity, 0.0).sum(axis=1)
    # every sample above all healthy capacity (see phase_metrics), not only in a phase short at its end
    common = np.maximum(np.maximum(1.0, run.loads.sum(axis=1) / np.maximum(healthy_cap, 1e-9)),
                        _reach_bound(scn, run))
    transient = np.zeros(len(run.times), dtype=bool)
    for ph in phases:
        inside = (run.times > ph["start_s"] + 1e-9) & (run.times <= ph["end_s"] + 1e-9)
        if long_enough(scn, ph):
            transient |= inside & (run.times <= ph["start_s"] + limit + 1e-9)
    excess = np.clip((ratio / common[:, None]).max(axis=1) - 1.0, 0.0, None)
    # overload judged: above capacity, or in a shortfall above the common factor (+ tolerance)
    band = np.where(common > 1.0, common * (1.0 + scn.targets.tolerance), 1.0)
    # … from the first tick after each change on: before it no controller can have reacted, and
    # every controller pays that dead time alike
    dead = np.zeros(len(run.times), dtype=bool)
    for ph in phases:
        first_tick = (math.floor(ph["start_s"] / scn.interval_s + 1e-9) + 1) * scn.interval_s
        dead |= (run.times > ph["start_s"] + 1e-9) & (run.times <= first_tick + 1e-9)
    judged_overload = float(((ratio[~dead] > band[~dead, None] + 1e-9) * scn.dt_s).sum())
    # nor the excess quantile: a phase too short for a transient of its own (an event at 30 s) left the start's
    # excess before the first tick in it (34.5 % on a run whose demand fell to 0 at 30 s: "missed" by every
    # controller alike), and a run of one interval was judged on nothing but that
    judged = excess[~(transient | dead)]
    rates = run.rates[np.clip(np.round(run.tick_times / scn.dt_s).astype(int) - 1, 0,
                              len(run.times) - 1)] if len(run.tick_times) else np.zeros((0, 0))
    churn = 0.0
    if len(run.tick_times):
        # the listener's traffic share per origin before and after each tick; the moves that
        # answer a step (within the settling allowance) are the job, not churn
        share = lambda w: np.einsum("ke,keo->ko", rates, w) / np.maximum(rates.sum(axis=1), 1e-9)[:, None]
        before = share(run.tick_weights[:-1])
        moved = 0.5 * np.abs(share(run.tick_weights[1:]) - before).sum(axis=1)
        tick_idx = np.clip(np.round(run.tick_times / scn.dt_s).astype(int) - 1, 0, len(run.times) - 1)
        # traffic on an origin the controller sees unhealthy must leave it (every controller
        # moves it alike, by the safety rule): not churn
        delay = int(round(scn.health_detection_delay_s / scn.dt_s))
        seen_down = ~run.healthy[np.clip(tick_idx - delay, 0, None)]
        moved = np.clip(moved - np.where(seen_down, before, 0.0).sum(axis=1), 0.0, None)
        calm = ~transient[tick_idx]
        # the first decision answers the scenario's starting weights, not a change: in a start phase too short
        # for a transient of its own (an event at 30 s) it was counted as churn (16 % of a 2-interval run)
        calm[0] = False
        churn = float(moved[calm].mean()) if calm.any() else 0.0
    within = np.minimum(run.loads, run.capacity) * run.healthy
    # latency where the weights are a free choice: in a shortfall the fair share of the excess
    # fixes them (a controller that overloads the near origins instead looks faster there)
    feasible = np.ones(len(run.times), dtype=bool)
    for ph in phases:
        if not ph["metrics"]["feasible"]:
            feasible &= ~((run.times > ph["start_s"] + 1e-9) & (run.times <= ph["end_s"] + 1e-9))
    rates, lat = run.rates[feasible], run.latency[feasible]
    feasible_latency = float((lat * rates).sum() / max(rates.sum(), 1e-9)) if feasible.any() else 0.0
    return {"excess_p95": float(np.quantile(judged, 0.95)) if len(judged) else 0.0,
            "judged_overload_s": judged_overload,
            "mean_latency_feasible_ms": feasible_latency,
            "churn": churn,
            "served_within_capacity": float(within.sum() * scn.dt_s),
            "served_over_capacity": float((run.loads * run.healthy - within).sum() * scn.dt_s)}


def trajectories(scn: Scenario, run: Run) -> dict[str, Any]:
    edges = [e.name for e in scn.edges]
    origins = [o.name for o in scn.origins]
    return {
        "tick_s": [0.0] + run.tick_times.tolist(),
        "weights": {e: {o: run.tick_weights[:, i, j].round(6).tolist() for j, o in enumerate(origins)}
                    for i, e in enumerate(edges)},
        # one entry per tick_s, as the weights: entry 0 is the starting weights (no decision yet)
        "modes": ["initial"] + run.tick_modes,
        "reasons": ["starting weights, before the first tick"] + run.tick_reasons,
        "time_s": run.times.tolist(),
        "origin_load_rps": {o: run.loads[:, j].round(3).tolist() for j, o in enumerate(origins)},
        "origin_capacity_rps": {o: run.capacity[:, j].tolist() for j, o in enumerate(origins)},
        "origin_healthy": {o: run.healthy[:, j].tolist() for j, o in enumerate(origins)},
        "origin_served_within_capacity_rps": {
            o: (np.minimum(run.loads[:, j], run.capacity[:, j]) * run.healthy[:, j]).round(3).tolist()
            for j, o in enumerate(origins)},
        "edge_rate_rps": {e: run.rates[:, i].round(3).tolist() for i, e in enumerate(edges)},
    }
