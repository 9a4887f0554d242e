"""Controllers: the safety guard over random inputs, fail-static, step bounds, versioning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controllers.edge.controller import (ControllerSettings, EdgeController, Observation,
                                         FixedStepController, UndampedController, enforce_safety,
                                         usable_mask)
from controllers.edge.model import Mode
from tests.controllers.test_edge_strategies import problems

INF = math.inf


def _obs(demand, capacity, latency, healthy, now=15.0, age=0.0):
    return Observation(now=now, demand=np.asarray(demand, float), capacity=np.asarray(capacity, float),
                       latency=np.asarray(latency, float), healthy=np.asarray(healthy, bool),
                       inputs_age_s=age)


def _check_rows(weights, latency, healthy):
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-9)
    assert (weights >= 0).all()
    usable = usable_mask(latency, healthy)
    for e in range(weights.shape[0]):
        if usable[e].any():
            assert weights[e][~usable[e]].sum() == 0, "share on an unhealthy/unreachable origin"


def _check_step_bound(previous, weights, usable, max_step):
    """Per usable origin: a share falls by at most max_step, and rises by at most max_step plus
    the share that had to leave unusable origins (that move is immediate)."""
    for e in range(weights.shape[0]):
        if not usable[e].any():
            continue
        evacuated = previous[e][~usable[e]].sum()
        change = weights[e][usable[e]] - previous[e][usable[e]]
        assert change.min() >= -max_step - 1e-9
        assert change.max() <= max_step + evacuated + 1e-9


@settings(max_examples=150, deadline=None)
@given(problems(), st.floats(0.01, 1.0), st.data())
def test_guard_holds_whatever_the_proposal(problem, max_step, data):
    _, _, latency, healthy, previous = problem
    shape = previous.shape
    proposal = np.array(data.draw(st.lists(st.floats(-1.0, 2.0), min_size=shape[0] * shape[1],
                                           max_size=shape[0] * shape[1]))).reshape(shape)
    out = enforce_safety(previous, proposal, latency, healthy, max_step)
    _check_rows(out, latency, healthy)
    usable = usable_mask(latency, healthy)
    _check_step_bound(previous, out, usable, max_step)
    # rows with nothing usable hold the previous weights
    for e in np.flatnonzero(~usable.any(axis=1)):
        np.testing.assert_allclose(out[e], previous[e])


def test_guard_moves_off_unhealthy_at_once_and_bounds_the_rest():
    latency = np.array([[10, 50, 90]])
    out = enforce_safety([[0.8, 0.2, 0.0]], [[0.0, 0.0, 1.0]], latency, [False, True, True], 0.1)
    assert out[0, 0] == 0  # the unhealthy origin's 80 % left in one step
    assert out.sum() == pytest.approx(1)
    out = enforce_safety([[0.8, 0.2, 0.0]], [[0.0, 0.0, 1.0]], latency, [True, True, True], 0.1)
    np.testing.assert_allclose(out, [[0.72, 0.18, 0.1]])  # scaled so the biggest change is 0.1


@settings(max_examples=40, deadline=None)
@given(problems(max_edges=4, max_origins=4), st.lists(st.floats(0.2, 3.0), min_size=6, max_size=6))
def test_controller_sequences_keep_the_safety_rules(problem, demand_factors):
    demand, capacity, latency, healthy, previous = problem
    for ctrl in (EdgeController(*latency.shape, initial=previous),
                 FixedStepController(*latency.shape, initial=previous),
                 UndampedController(*latency.shape, initial=previous)):
        last = previous
        for k, factor in enumerate(demand_factors):
            health = healthy if k % 3 else np.roll(healthy, k)
            decision = ctrl.step(_obs(demand * factor, capacity, latency, health, now=15.0 * k))
            _check_rows(decision.weights, latency, health)
            usable = usable_mask(latency, health)
            bound = 0.02 if isinstance(ctrl, FixedStepController) else ctrl.max_step
            _check_step_bound(last, decision.weights, usable, bound)
            for rec in decision.records("l", [f"e{i}" for i in range(len(demand))],
                                        [f"o{j}" for j in range(len(capacity))]):
                assert math.isclose(sum(rec.weights.values()), 1.0, abs_tol=1e-6)
            last = decision.weights


@settings(max_examples=60, deadline=None)
@given(problems(max_edges=4, max_origins=4, allow_unreachable=False, allow_unhealthy=False))
def test_capacity_respected_when_feasible(problem):
    """Constant, feasible demand: after a few intervals no origin is above capacity (+hot margin)."""
    demand, capacity, latency, healthy, previous = problem
    settings_ = ControllerSettings()
    if demand.sum() > capacity.sum() * (1 - settings_.headroom):
        return
    ctrl = EdgeController(*latency.shape, settings_, initial=previous)
    for k in range(6):
        decision = ctrl.step(_obs(demand, capacity, latency, healthy, now=15.0 * k))
    load = (decision.weights * demand[:, None]).sum(axis=0)
    assert (load <= capacity * (1 + settings_.hot_margin) + 1e-6).all()


def test_stale_inputs_hold_the_last_good_weights():
    ctrl = EdgeController(1, 2, ControllerSettings(stale_after_s=30), initial=[[1.0, 0.0]])
    fresh = ctrl.step(_obs([300], [200, 1000], [[20, 150]], [True, True]))
    assert fresh.mode is Mode.NORMAL and fresh.changed
    # inputs now say the near origin is dead, but they are 60 s old: hold, same version
    stale = ctrl.step(_obs([300], [200, 1000], [[20, 150]], [False, True], now=30, age=60))
    assert stale.mode is Mode.HOLD and "stale inputs" in stale.reason
    np.testing.assert_array_equal(stale.weights, fresh.weights)
    assert stale.version == fresh.version and not stale.changed
    rec = stale.records("192.0.2.10:443", ["sjc"], ["us", "eu"])[0]
    assert rec.mode is Mode.HOLD and rec.inputs_age_s == 60 and "stale" in rec.reason


def test_stale_without_history_falls_back_to_nearest_healthy():
    ctrl = EdgeController(1, 2)
    d = ctrl.step(_obs([300], [200, 1000], [[20, 150]], [False, True], age=600))
    assert d.mode is Mode.FALLBACK
    np.testing.assert_allclose(d.weights, [[0, 1]])


def test_overload_is_shed_in_one_interval_and_relaxing_is_bounded():
    s = ControllerSettings(headroom=0.05, relax_step=0.1, elasticity=0.0)
    ctrl = EdgeController(1, 2, s, initial=[[1.0, 0.0]])
    d1 = ctrl.step(_obs([300], [200, 1000], [[20, 150]], [True, True]))
    # straight to capacity·(1 - shed_headroom) in one step
    assert d1.weights[0, 0] * 300 == pytest.approx(200 * (1 - s.shed_headroom), rel=1e-6)
    assert "shed" in d1.reason
    # demand falls to 150: room again on the near origin, traffic returns at most 10 % a step
    shares = [d1.weights[0, 0]]
    for k in range(2, 22):
        shares.append(ctrl.step(_obs([150], [200, 1000], [[20, 150]], [True, True], now=15 * k))
                      .weights[0, 0])
    steps = np.diff(shares)
    assert (steps >= -1e-12).all() and steps.max() <= 0.1 + 1e-9
    assert shares[-1] == pytest.approx(1.0)


def test_relax_never_overloads_elastic_clients():
    """The worst-case-elastic prediction stops the relax step before clients push the origin over."""
    ctrl = EdgeController(1, 2, ControllerSettings(relax_gain=1.0, relax_step=1.0, max_step=1.0),
                          initial=[[0.5, 0.5]])
    latency = np.array([[20.0, 150.0]])
    # demand measured at the current 50/50 mix; closed-loop clients (rate ∝ 1/latency)
    base_latency = 0.5 * 20 + 0.5 * 150 + 10
    d = ctrl.step(_obs([300], [250, 1000], latency, [True, True]))
    new_latency = d.weights[0, 0] * 20 + d.weights[0, 1] * 150 + 10
    demand_after = 300 * base_latency / new_latency
    assert d.weights[0, 0] > 0.5  # it did move toward the near origin
    assert d.weights[0, 0] * demand_after <= 250 * 0.95 + 1e-6
    # the undamped target would overshoot: 237.5/300 of a demand that then grows
    undamped = UndampedController(1, 2, initial=[[0.5, 0.5]])
    u = undamped.step(_obs([300], [250, 1000], latency, [True, True]))
    u_latency = u.weights[0, 0] * 20 + u.weights[0, 1] * 150 + 10
    assert u.weights[0, 0] * 300 * base_latency / u_latency > 250


def test_version_changes_only_with_the_weights():
    ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    obs = _obs([100], [200, 1000], [[20, 150]], [True, True])
    first = ctrl.step(obs)
    again = ctrl.step(obs)
    assert not again.changed and again.version == first.version
    moved = ctrl.step(_obs([100], [200, 1000], [[20, 150]], [False, True]))
    assert moved.changed and moved.version == first.version + 1
    np.testing.assert_allclose(moved.weights, [[0, 1]])  # off the unhealthy origin at once


def test_bad_observations_and_settings_are_named():
    ctrl = EdgeController(2, 2)
    with pytest.raises(ValueError, match="observation: expected shapes"):
        ctrl.step(_obs([1], [1, 1], [[1, 1]], [True, True]))
    with pytest.raises(ValueError, match="inputs_age_s"):
        ctrl.step(_obs([1, 1], [1, 1], [[1, 1], [1, 1]], [True, True], age=float("nan")))
    with pytest.raises(ValidationError, match="relax_step: must not exceed max_step"):
        ControllerSettings(max_step=0.1, relax_step=0.2)
    with pytest.raises(ValidationError, match="headroom"):
        ControllerSettings(headroom=0.9)
    with pytest.raises(ValueError, match="initial weights"):
        EdgeController(1, 2, initial=[[0.0, 0.0]])


def test_shortfall_and_hold_raise_findings():
    from controllers.edge.findings import HOLD_DETECTOR, SHED_DETECTOR, decision_findings
    from opsloop.findings import Finding, Severity

    ctrl = EdgeController(2, 2, initial=[[1.0, 0.0], [0.0, 1.0]])
    short = ctrl.step(_obs([300, 300], [200, 200], [[10, 50], [50, 10]], [True, True]))
    assert short.mode is Mode.SHED
    found = decision_findings(short, "192.0.2.10:443", ["ams", "nyc"], now=1795310400.0)
    assert [f.detector for f in found] == [SHED_DETECTOR]
    shed = found[0]
    assert shed.observed == pytest.approx(600 - 380, rel=1e-6)  # 2 × 200 × 0.95 served
    assert shed.severity is Severity.CRITICAL and "ams" in shed.explanation
    assert Finding.decode(shed.encode()).id == shed.id
    held = ctrl.step(_obs([300, 300], [200, 200], [[10, 50], [50, 10]], [True, True], age=120))
    found = decision_findings(held, "192.0.2.10:443", ["ams", "nyc"], now=1795310415.0,
                              include_cleared=True)
    by_detector = {f.detector: f for f in found}
    assert by_detector[HOLD_DETECTOR].severity is Severity.WARNING
    assert "stale inputs" in by_detector[HOLD_DETECTOR].explanation
    assert SHED_DETECTOR not in by_detector  # nothing planned on stale inputs: shortfall unknown
    for k in range(2):  # the demand estimate is the max of the last 2 intervals
        fine = ctrl.step(_obs([100, 100], [200, 200], [[10, 50], [50, 10]], [True, True]))
    assert decision_findings(fine, "l", ["ams", "nyc"], now=1795310430.0) == []
    cleared = decision_findings(fine, "l", ["ams", "nyc"], now=1795310430.0, include_cleared=True)
    assert {f.detector for f in cleared} == {SHED_DETECTOR, HOLD_DETECTOR}
    assert all(f.cleared for f in cleared)
