"""A ramp's slope is the clients' own rise: raw rates over intervals in which our sheds moved
traffic farther (elastic clients slowing down) understate it, and the plan fell short of the ramp
(robustness/mesh_three_by_five_ramp: the origins ran over capacity again an interval after a shed)."""

from __future__ import annotations

import numpy as np

from opsloop.controllers.edge.controller import EdgeController


def test_the_ramp_ahead_is_the_clients_own_rise_not_the_raw_one():
    ctrl = EdgeController(1, 2)
    for _ in range(8):
        ctrl._demand_estimate(np.array([200.0]), np.array([20.0]))
    # the clients' own demand +9 % an interval, their latency +5 % an interval (our sheds):
    # the raw rate rises ~4 % an interval (elastic clients)
    own, latency = 200.0, 20.0
    for _ in range(3):
        own *= 1.09
        latency *= 1.05
        estimate, _, rising = ctrl._demand_estimate(np.array([own * 20.0 / latency]), np.array([latency]))
    last = own * 20.0 / latency
    assert rising[0]
    # one interval of the clients' own rise ahead (9 %), not of the raw one (~4 %)
    assert estimate[0] >= last * 1.085, (estimate[0], last)
