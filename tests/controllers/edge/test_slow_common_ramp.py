"""A slow ramp common to the edges (a daily peak rising ~2 % an interval) under measurement noise
of the same size: no three intervals clear the ramp tests, so nothing moved until an origin
reached capacity (robustness/mesh_slow_noisy_ramp: 21 s over capacity, 0 with the trend). The
slope of the edges' mean level over eight readings, beyond 4 standard errors of its own fit,
makes it a ramp; a step, one edge rising alone and noise alone do not."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController, Observation

CAP = np.array([300.0, 300.0, 250.0, 200.0])
LAT = np.array([[5.0, 20.0, 50.0, 25.0], [20.0, 6.0, 70.0, 40.0], [50.0, 65.0, 8.0, 35.0]])
BASE = np.array([200.0, 210.0, 150.0])  # 60-70 % of each edge's own origin


def _run(factors: list[np.ndarray], noise: float = 0.025, seed: int = 3):
    """Eight steady intervals, then one demand factor per edge per interval, each reading with
    ``noise`` relative measurement noise; the controller, its decisions on the factors and the
    edges it read as rising at each of them."""
    rng = np.random.default_rng(seed)
    ctrl = EdgeController(3, 4, initial=np.eye(3, 4))
    healthy = np.ones(4, dtype=bool)

    def tick(k: int, f: np.ndarray):
        demand = BASE * f * (1.0 + noise * rng.standard_normal(3))
        return ctrl.step(Observation(now=15.0 * k, demand=demand, capacity=CAP, latency=LAT,
                                     healthy=healthy))
    for k in range(8):
        tick(k, np.ones(3))
    decisions, rising = [], []
    for i, f in enumerate(factors):
        decisions.append(tick(8 + i, f))
        rising.append(ctrl.demand.rising.copy())
    return ctrl, decisions, rising


def test_a_slow_common_ramp_under_noise_is_planned_ahead():
    # +2 % an interval on every edge, 2.5 % noise: from its 8th interval on (a full window of
    # it) the edges are read as rising (one whose last draw fell far may sit one out) and the
    # plan is ahead of the level reached
    for seed in range(3):
        _, ds, rising = _run([np.full(3, 1.02 ** k) for k in range(1, 13)], seed=seed)
        for k in range(8, 13):
            assert rising[k - 1].sum() >= 2, (seed, k, rising[k - 1])
            ahead = ds[k - 1].demand_estimate / (BASE * 1.02 ** k)
            assert ahead.mean() >= 1.01, (seed, k, ahead)


def test_a_common_step_is_no_slow_ramp():
    # +12 % on every edge at once, then flat: the window fits a level shift, not a line
    _, ds, rising = _run([np.full(3, 1.12)] * 10)
    assert not np.any(rising[2:])
    assert (ds[-1].demand_estimate <= BASE * 1.12 * 1.10).all(), ds[-1].demand_estimate


def test_one_edge_rising_alone_lifts_no_other_edge():
    _, ds, rising = _run([np.array([1.03 ** k, 1.0, 1.0]) for k in range(1, 11)])
    assert not np.any([r[1:] for r in rising])
    assert (ds[-1].demand_estimate[1:] <= BASE[1:] * 1.10).all(), ds[-1].demand_estimate


def test_noise_alone_is_no_slow_ramp():
    # 2.5 % noise on flat demand: 300 windows of eight readings, none read as a slow ramp
    ctrl = EdgeController(3, 4)
    rng = np.random.default_rng(11)
    flagged = 0
    for _ in range(300):
        logs = np.log(BASE * (1.0 + 0.025 * rng.standard_normal((8, 3))))
        changes = np.diff(logs, axis=0)
        flagged += ctrl.demand._slow_common_ramp(changes, changes) > 0
    assert flagged == 0
    # and the same windows with a +2 % an interval ramp in them are
    ramp = np.log(1.02) * np.arange(8)[:, None]
    found = sum(ctrl.demand._slow_common_ramp(c, c) > 0 for c in (
        np.diff(np.log(BASE * (1.0 + 0.025 * rng.standard_normal((8, 3)))) + ramp, axis=0)
        for _ in range(300)))
    assert found >= 150, found
