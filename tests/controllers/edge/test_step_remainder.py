"""The rise in the interval after a demand step was read is that step's remainder (the step came
late in its interval and the clients took a while to reach it), not the third rise of a ramp.
Read as a ramp (a small positive draw before the step made three rises in a row), the plan went
one more interval of that "ramp" above the demand that came: in a ``bench.sim_kinds`` shortfall
(seed 41, #3) 47 % above it, and the far origins were overfilled for an interval. A ramp that
goes on rising after the step is still read, one interval later."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController, Observation

LAT = np.array([[5.6, 12.3, 48.8], [6.2, 8.7, 45.3]])  # both edges near o1, o3 far
BASE = np.array([150.0, 100.0])
CALM = [1.0 + 0.01 * np.random.default_rng(0).standard_normal(2) for _ in range(10)]
# a small rise (a positive noise draw), a step landing late in an interval (its mean shows
# about half of it), then its full level
STEP = [np.full(2, 1.02), np.full(2, 2.07), np.full(2, 2.72)]


def _run(capacity: np.ndarray, factors: list[np.ndarray]
         ) -> tuple[EdgeController, list[np.ndarray], list[np.ndarray]]:
    """Feed BASE x each factor (both edges on o1); the controller and, per tick, the edges it
    read as rising and those whose step it read."""
    ctrl = EdgeController(2, 3, initial=np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    rising, stepped = [], []
    for k, f in enumerate(factors):
        ctrl.step(Observation(now=15.0 * k, demand=BASE * f, capacity=capacity, latency=LAT,
                              healthy=np.ones(3, dtype=bool)))
        rising.append(ctrl.demand.rising.copy())
        stepped.append(ctrl.demand.step_seen.copy())
    return ctrl, rising, stepped


def test_the_rise_after_a_step_is_no_ramp_and_nothing_is_over_shed():
    # o1 holds the step's full level with one edge's half moved off: 408 + 272 / 2 < 634 x 0.95;
    # planned on a ramp the controller moved 81 % of e2 off o1 (onto o2/o3 at 40 % each)
    capacity = np.array([634.0, 190.0, 190.0])
    ctrl, rising, stepped = _run(capacity, CALM + STEP)
    assert stepped[-2].all(), stepped[-3:]  # the step was read at its interval's tick
    assert not rising[-1].any(), rising[-3:]
    full = BASE * STEP[-1]
    assert ctrl.weights[1, 0] >= 0.5, ctrl.weights
    assert (ctrl.weights * full[:, None]).sum(axis=0)[0] <= capacity[0], ctrl.weights


def test_a_ramp_going_on_after_a_step_is_read_an_interval_later():
    capacity = np.array([1634.0, 590.0, 590.0])  # room for all of it: no shed moves the mix
    _, rising, stepped = _run(capacity, CALM + STEP + [np.full(2, 3.3), np.full(2, 3.9)])
    assert stepped[-4].all(), stepped[-5:]
    assert not rising[-3].any(), rising[-4:]
    assert rising[-2].all() and rising[-1].all(), rising[-4:]
