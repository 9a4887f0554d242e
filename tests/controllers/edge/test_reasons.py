"""The reason of each decision (shown by ``opsloop edge status`` and on ``edge.weights``) says what is
true of the weights pushed: origins by name, "holding down" exactly when an origin is held at
weight 0, "at target" only with nothing over capacity and nothing left to move."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.controllers.edge.controller import EdgeController, Observation
from opsloop.records import Mode

NAMES = ["near", "far"]
LATENCY = [[10.0, 80.0]]


def _obs(demand, capacity, healthy, now, latency=LATENCY, age=0.0, origin_ms=None):
    return Observation(now=now, demand=np.asarray(demand, float), capacity=np.asarray(capacity, float),
                       latency=np.asarray(latency, float), healthy=np.asarray(healthy, bool),
                       inputs_age_s=age,
                       origin_latency_ms=None if origin_ms is None else np.asarray(origin_ms, float))


class Ticker:
    def __init__(self, ctrl: EdgeController) -> None:
        self.ctrl, self.t = ctrl, 0.0

    def __call__(self, demand, capacity, healthy=(True, True), **kw):
        self.t += 15.0
        return self.ctrl.step(_obs(demand, capacity, list(healthy), self.t, **kw))


def _ctrl(**settings) -> EdgeController:
    return EdgeController(1, 2, ControllerSettings(interval_s=15, **settings), initial=[[1.0, 0.0]],
                          origin_names=NAMES)


def test_held_down_origin_is_named_and_at_weight_zero_then_ramped_in_by_name():
    tick = Ticker(_ctrl(hold_down_intervals=2, slowstart_intervals=4))
    tick([200], [400, 1000])
    tick([200], [400, 1000], healthy=(False, True))
    held = [tick([200], [400, 1000]) for _ in range(2)]
    for d in held:
        assert "holding down returning origin(s) near" in d.reason, d.reason
        assert "#0" not in d.reason and d.weights[0, 0] == 0.0
    ramp = tick([200], [400, 1000])
    assert "holding down" not in ramp.reason and ramp.weights[0, 0] > 0
    assert "ramping in origin(s) near at 25% of capacity" in ramp.reason, ramp.reason


def test_holding_down_appears_exactly_when_an_origin_is_held_at_weight_zero():
    # two edges: "solo" reaches only near; when far fails, near (back, in its hold-down) is the only
    # healthy origin of solo and carries its traffic: not called held down
    ctrl = EdgeController(2, 2, ControllerSettings(interval_s=15, hold_down_intervals=4),
                          initial=[[1.0, 0.0], [1.0, 0.0]], origin_names=NAMES)
    latency = [[10.0, 80.0], [10.0, math.inf]]
    t = 0.0

    def tick(healthy):
        nonlocal t
        t += 15
        return ctrl.step(_obs([100, 100], [400, 1000], healthy, t, latency=latency))

    tick([True, True])
    tick([False, True])
    back = tick([True, True])
    # solo has nothing else healthy: it uses near at once; so near carries traffic
    assert back.weights[1, 0] == 1.0 and back.weights[0, 0] == 0.0
    assert "holding down" not in back.reason, back.reason
    assert "returning origin(s) near used before its hold-down ends" in back.reason, back.reason


def test_at_target_only_when_nothing_moves_and_nothing_is_over_capacity():
    tick = Ticker(_ctrl())
    settled = [tick([200], [400, 1000]) for _ in range(3)][-1]
    assert settled.reason == "at target", settled.reason
    assert settled.mode is Mode.NORMAL


def test_shed_names_the_overloaded_origin_with_its_load():
    tick = Ticker(_ctrl())
    tick([200], [400, 1000])
    d = tick([600], [400, 1000])
    assert d.reason.startswith("shed off overloaded origin(s) near 600/400 req/s"), d.reason
    assert "at target" not in d.reason and d.weights[0, 0] < 1.0


def test_a_shortfall_is_not_called_at_target():
    tick = Ticker(_ctrl())
    for _ in range(6):
        d = tick([2000], [400, 1000])
    assert d.mode is Mode.SHED
    assert d.reason.startswith("shares kept: no origin above the common overload factor; "
                               "served fraction"), d.reason


def test_no_healthy_origin_holds_and_says_so():
    tick = Ticker(_ctrl())
    tick([200], [400, 1000])
    d = tick([200], [400, 1000], healthy=(False, False))
    assert d.mode is Mode.HOLD
    assert d.reason.startswith("holding the last weights: no healthy origin"), d.reason
    assert "at target" not in d.reason


def test_stale_inputs_hold_and_say_so():
    tick = Ticker(_ctrl())
    tick([200], [400, 1000])
    d = tick([200], [400, 1000], age=120.0)
    assert d.mode is Mode.HOLD and d.reason.startswith("stale inputs: age 120s"), d.reason


def test_a_reading_over_capacity_not_acted_on_is_said():
    # near was seen slowing down when overloaded; later one reading 1 % over capacity while it
    # answers at its unloaded speed is measurement noise: nothing moves, and the reason says so
    tick = Ticker(_ctrl())
    for _ in range(4):
        tick([300], [400, 1000], origin_ms=[5.0, 5.0])
    assert "shed off overloaded origin(s) near" in tick([450], [400, 1000], origin_ms=[15.0, 5.0]).reason
    for _ in range(8):
        settled = tick([300], [400, 1000], origin_ms=[5.0, 5.0])
    d = tick([404 / settled.weights[0, 0]], [400, 1000], origin_ms=[5.0, 5.0])
    assert d.reason.startswith("origin(s) near 404/400 req/s read over capacity while answering at "
                               "unloaded speed: taken as measurement noise"), d.reason
    assert "at target" not in d.reason
    np.testing.assert_array_equal(d.weights, settled.weights)


def test_hysteresis_is_not_called_at_target():
    # an edge whose target is a farther origin at equal latency: the move would not lower latency
    ctrl = EdgeController(1, 2, ControllerSettings(interval_s=15), initial=[[0.5, 0.5]],
                          origin_names=NAMES)
    t = 0.0
    for _ in range(3):
        t += 15
        d = ctrl.step(_obs([100], [1000, 1000], [True, True], t, latency=[[10.0, 10.0]]))
    # the LP's target is all on far (a tie); the move gains nothing: the weights stay, not "at target"
    assert float(np.abs(d.target - d.weights).max()) == pytest.approx(0.5)
    np.testing.assert_allclose(d.weights, [[0.5, 0.5]])
    assert d.reason.startswith("holding: the move to the target (50% of an edge's traffic at most) "
                               "would neither lower latency nor relieve an origin"), d.reason


def test_origin_names_must_match_the_origins():
    with pytest.raises(ValueError, match="origin_names: expected 2 names, got 1"):
        EdgeController(1, 2, origin_names=["near"])


def test_a_shortfall_shed_names_the_origin_above_the_common_factor():
    ctrl = EdgeController(2, 2, ControllerSettings(interval_s=15), initial=[[1.0, 0.0], [1.0, 0.0]],
                          origin_names=NAMES)
    d = ctrl.step(_obs([900, 600], [400, 600], [True, True], 15.0, latency=[[10.0, 80.0], [10.0, 20.0]]))
    assert d.mode is Mode.SHED
    assert d.reason.startswith("shed off origin(s) near 1500/400 req/s above the common overload "
                               "factor, every edge moved jointly"), d.reason
