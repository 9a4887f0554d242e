"""The demand model across an idle spell and near the LP's rate bound (found by an audit's fuzzing):
a reading of 0 is no log-demand to read a change from, noise so large that a doubling hides in it is
no noise to plan a mean on, and what the plan hands the LP stays within what it takes."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.base import Observation
from opsloop.controllers.edge.controller import EdgeController
from opsloop.controllers.edge.scheduler import MAX_RATE

INTERVAL = 15.0


def _run(ctl: EdgeController, demands: list[list[float]], capacity: list[float],
         latency: list[list[float]]) -> list:
    out = []
    for k, row in enumerate(demands):
        out.append(ctl.step(Observation(now=INTERVAL * (k + 1), demand=np.array(row, dtype=float),
                                        capacity=np.array(capacity), latency=np.array(latency),
                                        healthy=np.ones(len(capacity), dtype=bool))))
    return out


def test_demand_back_after_an_idle_spell_is_planned_at_its_level_and_shed_at_once() -> None:
    # 0 req/s read as log 1e-9 made changes of ±20: σ ~8, the demand "noisy", and the plan sat at the
    # window's mean (1.7k of 10k) with the near origin at 200 % and the reason "at target" for 60 s
    seq = [3000, 3000, 0, 0, 0, 0, 50, 50] + [10000] * 6
    decisions = _run(EdgeController(1, 2, origin_names=["near", "far"]), [[d] for d in seq],
                     [5000.0, 1e6], [[5.0, 80.0]])
    back = seq.index(10000)
    for d in decisions[back:]:
        assert d.demand_estimate[0] >= 10000 * 0.99
        assert 10000 * d.weights[0, 0] <= 5000 * 1.05    # the near origin within capacity at once
    assert "shed" in decisions[back].reason


def test_a_step_without_noise_around_it_is_no_noise_to_plan_a_mean_on() -> None:
    # a step from 50 to 1e9 req/s with nothing else in the window read as σ 5: the plan went on the
    # window's mean, a quarter below the demand, for five intervals
    seq = [1e9, 1e9, 0, 0, 0, 0, 50, 50] + [1e9] * 8
    decisions = _run(EdgeController(1, 1), [[d] for d in seq], [2e9], [[20.0]])
    for d, measured in zip(decisions, seq):
        assert d.demand_estimate[0] >= measured * 0.999


def test_steps_and_ramps_near_the_rate_bound_are_planned_within_it() -> None:
    # a step's extrapolation, or a ramp's, of valid readings near 1e12 req/s went past the LP's bound
    # and every tick raised (the live loop published nothing) until the step left the window
    for seq in ([1e9] * 6 + [9e11] * 4, [min(1e11 * 1.5 ** k, MAX_RATE) for k in range(10)]):
        decisions = _run(EdgeController(2, 2), [[d, 5.0] for d in seq], [2e11, 1e12],
                         [[20.0, 50.0], [20.0, 50.0]])
        assert len(decisions) == len(seq)
        for d in decisions:
            assert (d.demand_estimate <= MAX_RATE).all()
            assert np.allclose(d.weights.sum(axis=1), 1.0)
