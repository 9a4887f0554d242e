"""Between origins within ``stickiness_ms`` (0.5 ms) of each other the current one keeps its share:
moving traffic for less is churn. With 0.1 ms, the ramp-in after a flapping origin's hold-down moved
both edges back onto it, one of them for 0.3 ms (8.8 vs 8.5 ms): 3.6 % of the traffic moved per
interval where the verdict allows 3 %. A draw of ``bench.sim_kinds`` (testdata/, the file says which)."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController, Observation
from tests.controllers.edge.drawn_cases import run_meeting_targets


def _settled(latency: list[float], ticks: int = 12) -> np.ndarray:
    """One edge on its first origin, both far below capacity, steady demand: the weights after
    ``ticks`` intervals."""
    ctrl = EdgeController(1, 2, initial=np.array([[1.0, 0.0]]))
    decision = None
    for k in range(ticks):
        decision = ctrl.step(Observation(now=15.0 * k, demand=np.array([100.0]),
                                         capacity=np.array([1000.0, 1000.0]),
                                         latency=np.array([latency]), healthy=np.ones(2, dtype=bool)))
    return decision.weights[0]


def test_an_origin_a_fraction_of_a_millisecond_nearer_wins_no_traffic():
    assert _settled([8.8, 8.5])[0] == 1.0


def test_an_origin_clearly_nearer_wins_the_traffic():
    # the same edge, 0.8 ms nearer: the relax steps move it all (0.2 of a share, then half the gap)
    assert _settled([8.8, 8.0])[1] == 1.0


def test_flapping_origin_ramped_back_without_churn():
    run_meeting_targets("flapping-11-7")
