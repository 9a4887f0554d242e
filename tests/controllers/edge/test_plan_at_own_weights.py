"""The target is planned on what the clients will send at the plan's own weights: closed-loop
clients moved to a far origin send less, and a shed planned on what they sent from the near one
moved several times the traffic needed (US/EU-like, 20 vs 150 ms: 12 % of the edge where ~3 %
relieved the origin, whose load then fell far below capacity). A fall is only counted as far as
our own moves show it beyond the demand's noise (open-loop noisy clients show none)."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController, Observation
from opsloop.controllers.edge.sim import run_scenario
from opsloop.controllers.edge.sim.scenario import Scenario


def _useu(events: list[dict], elasticity: float = 1.0) -> Scenario:
    return Scenario.model_validate({
        "name": "plan_at_own_weights", "interval_s": 15, "duration_s": 600, "dt_s": 1, "seed": 4,
        "noise": 0.005, "client_tau_s": 2, "overload_slowdown": 1.0,
        "controllers": ["ours", "fixed-step"],
        "origins": [{"name": "us", "capacity_rps": 200, "service_ms": 10},
                    {"name": "eu", "capacity_rps": 1000, "service_ms": 10}],
        "edges": [{"name": "sjc", "base_rps": 250, "elasticity": elasticity,
                   "latency_ms": {"us": 20, "eu": 150}, "initial_weights": {"us": 1.0}}],
        "events": events})


def test_a_second_shed_of_closed_loop_clients_moves_what_relieves_the_origin():
    # the first shed (t=0, 125 % of capacity) shows the clients' elasticity; back to all-US at
    # 150 req/s, then +40 %: the second shed must bring US under capacity without emptying it
    scn = _useu([{"at": 120, "demand": {"sjc": 150}},
                 {"at": 300, "demand": {"sjc": 215}, "ramp_s": 45}])
    _, runs = run_scenario(scn, ["ours"])
    run = runs["ours"]
    us = run.loads[:, 0] / run.capacity[:, 0]
    ticks = run.tick_times
    shed = next(k for k, t in enumerate(ticks) if t > 300 and run.tick_weights[k + 1, 0, 0] < 0.999)
    after = (run.times > ticks[shed] + 5) & (run.times <= ticks[shed] + 15)
    moved = 1.0 - run.tick_weights[shed + 1, 0, 0]
    assert us[after].max() <= 1.0 + 1e-9, us[after].max()
    assert us[after].min() >= 0.8, (moved, us[after].min())  # not emptied by an oversized move
    assert moved <= 0.06, moved


def _step(ctrl: EdgeController, demand: float, t: float):
    return ctrl.step(Observation(now=t, demand=np.array([demand]), capacity=np.array([40.0, 400.0]),
                                 latency=np.array([[10.0, 40.0]]), healthy=np.array([True, True])))


def test_noisy_open_loop_demand_is_not_planned_to_fall_when_moved_away():
    # open-loop clients (the rate ignores the latency) with 10 % noise: each of our moves reads as
    # some elasticity by chance; the fit over them, less its standard error, counts on none
    rng = np.random.default_rng(3)
    ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    for k in range(60):
        d = _step(ctrl, 38.0 * (1.0 + 0.1 * rng.standard_normal()), 15.0 * k)
    assert (ctrl.demand.fall_elasticity() == 0.0).all()
    assert d.weights[0, 0] * d.demand_estimate[0] <= 40.0
