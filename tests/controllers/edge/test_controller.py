"""Controllers: the safety guard over random inputs, fail-static, step bounds, versioning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.controllers.edge.base import Observation
from opsloop.controllers.edge.baselines import FixedStepController, UndampedController
from opsloop.controllers.edge.controller import EdgeController
from opsloop.controllers.edge.safety import enforce_safety, usable_mask
from opsloop.records import Mode
from tests.controllers.edge.test_strategies import problems

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
    # rows with nothing usable hold the previous weights (fail static on health), except what
    # was on an origin they have no path to: that moves to the reachable ones, as they share it
    for e in np.flatnonzero(~usable.any(axis=1)):
        reach = np.isfinite(latency[e])
        if not reach.any():
            np.testing.assert_allclose(out[e], previous[e])
            continue
        assert out[e][~reach].sum() == 0.0
        if previous[e][reach].sum() > 1e-9:
            np.testing.assert_allclose(out[e][reach], previous[e][reach] / previous[e][reach].sum())


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


# found by the search below (each needed 8 intervals and more): an origin of capacity 0, and an
# edge whose move is onto a 0 ms path (worst-case clients predicted at 100x their rate)
_ZERO_CAPACITY = (np.array([107.0, 0.0, 0.0, 696.0]), np.array([0.0, 190.0, 682.0]),
                  np.array([[51.0, 27.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 7.0, 0.0]]),
                  np.array([True, True, True]),
                  np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
_ONTO_ZERO_MS = (np.array([215.6, 821.4]), np.array([301.8, 819.1]),
                 np.array([[0.5, 0.2], [107.0, 0.0]]), np.array([True, True]),
                 np.array([[0.7, 0.3], [1.0, 0.0]]))
# ... and an edge moved from 39 ms toward 0 ms: a rate doubling predicted for every halving of its
# latency, which its clients never showed (7 intervals with the worst case kept)
_HALVINGS = (np.array([0.0, 228.0, 392.0, 365.0]), np.array([37.0, 462.0, 571.0]),
             np.array([[0.0, 101.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 39.0], [0.0, 0.0, 1.0]]),
             np.array([True, True, True]),
             np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))


@settings(max_examples=60, deadline=None)
@given(problems(max_edges=4, max_origins=4, allow_unreachable=False, allow_unhealthy=False))
@example(_ZERO_CAPACITY)
@example(_ONTO_ZERO_MS)
@example(_HALVINGS)
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


@pytest.mark.parametrize("problem", [_ZERO_CAPACITY, _ONTO_ZERO_MS, _HALVINGS],
                         ids=["capacity-0", "onto-0-ms", "halvings"])
def test_a_certain_overload_is_not_kept_to_spare_a_predicted_one(problem):
    """Demand within 5 % of all capacity, the hot origin's relief onto an origin whose worst-case
    clients (moved toward a 0 ms path) are predicted far beyond it: the move goes as far as leaves
    that origin no more overloaded than the hot one, and for clients as elastic as our moves
    showed; as the demand stays put (the clients are not elastic), the hot origin is relieved
    within four decisions (8, 10 and 7 before)."""
    demand, capacity, latency, healthy, previous = problem
    ctrl = EdgeController(*latency.shape, initial=previous)
    for k in range(4):
        decision = ctrl.step(_obs(demand, capacity, latency, healthy, now=15.0 * k))
    load = (decision.weights * demand[:, None]).sum(axis=0)
    assert (load <= capacity * (1 + ctrl.settings.hot_margin) + 1e-6).all(), (load, capacity)


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


@pytest.mark.parametrize("controller", ["ours", "fixed-step"])
def test_stale_demand_with_fresh_health_moves_off_a_dead_origin_and_holds_the_rest(controller):
    """Demand 60 s old but health checks current: the demand-driven weights are held (fail static), the
    share on the origin the checks call down moves at once (safety rule 1), to where a plan on the last
    demand seen has room: a move in proportion to the held weights would put the small origin at 125 %."""
    names, initial = ["us", "eu", "ap"], [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]
    ctrl = (EdgeController(2, 3, ControllerSettings(stale_after_s=30), initial=initial, origin_names=names)
            if controller == "ours" else FixedStepController(2, 3, initial=initial, origin_names=names))
    lat, cap, demand = [[20, 90, 150], [150, 20, 90]], np.asarray([1000.0, 1000.0, 150.0]), np.asarray([300.0, 300.0])
    d = ctrl.step(Observation(now=30, demand=demand, capacity=cap, latency=np.asarray(lat, float),
                              healthy=np.asarray([False, True, True]), inputs_age_s=60, health_age_s=0.0))
    assert d.mode is Mode.HOLD and d.stale and "stale inputs" in d.reason and "moved off us" in d.reason
    _check_rows(d.weights, lat, [False, True, True])
    assert (d.weights[:, 1:] >= np.asarray(initial)[:, 1:] - 1e-12).all()   # nothing taken off a healthy origin
    assert (demand @ d.weights)[1:] == pytest.approx([480.0, 120.0])        # the dead origin's 240 req/s onto eu
    assert d.changed and d.version == 1
    # health as old as the demand: nothing moves (the last good weights are held whole)
    stale_all = ctrl.step(Observation(now=45, demand=demand, capacity=cap, latency=np.asarray(lat, float),
                                      healthy=np.asarray([True, False, True]), inputs_age_s=75))
    np.testing.assert_array_equal(stale_all.weights, d.weights)
    assert not stale_all.changed and "moved off" not in stale_all.reason


def test_stale_without_history_falls_back_to_nearest_healthy():
    ctrl = EdgeController(1, 2)
    d = ctrl.step(_obs([300], [200, 1000], [[20, 150]], [False, True], age=600))
    assert d.mode is Mode.FALLBACK
    np.testing.assert_allclose(d.weights, [[0, 1]])


def test_overload_is_shed_in_one_interval_and_relaxing_is_bounded():
    s = ControllerSettings(headroom=0.05, relax_step=0.1, elasticity=0.0, clear_relax_margin=1.0)
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


def _home_after_a_shed(demand_after: float) -> tuple[list[float], list[str]]:
    """Shed 300 req/s off a 200 req/s near origin, then demand falls to ``demand_after``: the
    near origin's share, tick by tick, and the reasons."""
    ctrl = EdgeController(1, 2, ControllerSettings(headroom=0.05, relax_step=0.1, elasticity=0.0),
                          initial=[[1.0, 0.0]])
    shares = [ctrl.step(_obs([300], [200, 1000], [[20, 150]], [True, True])).weights[0, 0]]
    reasons = []
    for k in range(2, 14):
        d = ctrl.step(_obs([demand_after], [200, 1000], [[20, 150]], [True, True], now=15 * k))
        shares.append(d.weights[0, 0])
        reasons.append(d.reason)
    return shares, reasons


def test_a_long_way_home_with_room_to_spare_goes_at_up_to_max_step():
    """The near origin at 150 of 200 req/s (its plan 190, 10 % below it 171): the shed traffic
    comes back in one step of up to max_step (0.5), not at the relax step (0.1) over four."""
    shares, reasons = _home_after_a_shed(150)
    steps = np.diff(shares)
    assert (steps >= -1e-12).all() and steps.max() <= 0.5 + 1e-9
    assert steps.max() > 0.1 + 1e-9
    assert shares[-1] == pytest.approx(1.0)
    assert sum(steps > 1e-9) <= 2
    assert any("below their plan: up to 50% of an edge's traffic" in r for r in reasons)


def test_the_way_home_near_the_plan_stays_at_the_relax_step():
    """At 175 req/s the near origin would end within its plan (190) but not 10 % below it: the
    share comes back at the relax step (0.1), and never past the plan."""
    shares, reasons = _home_after_a_shed(175)
    steps = np.diff(shares)
    assert (steps >= -1e-12).all() and steps.max() <= 0.1 + 1e-9
    assert shares[-1] * 175 <= 190 + 1e-6
    assert shares[-1] * 175 > 171
    assert not any("below their plan: up to" in r for r in reasons)


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


@pytest.mark.parametrize("bad, needle", [
    ({"demand": [INF, 100.0]}, "observation.demand[0]: expected at most 1e+12 req/s, got inf"),
    ({"demand": [100.0, 1e15]}, "observation.demand[1]: expected at most 1e+12 req/s"),
    ({"demand": [math.nan, 100.0]}, "observation.demand[0]: expected a finite number >= 0, got nan"),
    ({"demand": [100.0, -5.0]}, "observation.demand[1]: expected a finite number >= 0, got -5.0"),
    ({"capacity": [1e13, 300.0]}, "observation.capacity[0]: expected at most 1e+12 req/s"),
    ({"capacity": [200.0, math.nan]}, "observation.capacity[1]: expected a finite number >= 0, got nan"),
    ({"capacity": [-1.0, 300.0]}, "observation.capacity[0]: expected a finite number >= 0, got -1.0"),
    ({"latency": [[10.0, 1e300], [80.0, 10.0]]}, "observation.latency[0, 1]: expected at most 1e+09 ms"),
    ({"origin_latency_ms": [5.0, INF]}, "observation.origin_latency_ms[1]: expected at most 1e+09 ms"),
])
@pytest.mark.parametrize("kind", [EdgeController, FixedStepController])
def test_a_reading_beyond_the_lps_numbers_is_refused_before_the_state_changes(kind, bad, needle):
    """A demand of 1e15 req/s (or an infinite one, or a response time of inf; or a capacity that
    is not a number >= 0) is refused naming the field, and leaves the controller as it was: the next good observations get the decisions they
    get without it. Before, an infinite reading went into the demand history as 1.8e308 and every
    tick failed ("fairness LP failed: Model error") until it left the window."""
    def good(t: int) -> Observation:
        obs = _obs([150.0 + 40 * (t % 3), 90.0], [200.0, 300.0], [[10.0, 60.0], [80.0, 10.0]],
                   [True, True], now=15.0 * t)
        obs.origin_latency_ms = np.array([5.0 + t % 2, 5.0])
        return obs

    clean, hit = kind(2, 2), kind(2, 2)
    for t in range(12):
        if t in (4, 7):
            fields = {"demand": good(t).demand, "capacity": good(t).capacity,
                      "latency": good(t).latency, "origin_latency_ms": good(t).origin_latency_ms,
                      **{k: np.asarray(v, float) for k, v in bad.items()}}
            with pytest.raises(ValueError) as err:
                hit.step(Observation(now=15.0 * t, healthy=np.array([True, True]), **fields))
            assert needle in str(err.value)
        a, b = clean.step(good(t)), hit.step(good(t))
        np.testing.assert_array_equal(a.weights, b.weights)
        assert (a.version, a.reason) == (b.version, b.reason)


@pytest.mark.parametrize("kind", [EdgeController, FixedStepController])
def test_a_demand_of_nan_is_refused_fresh_and_held_stale(kind):
    """A fresh observation with no demand reading for an edge (NaN) is refused, not planned as an
    edge of zero demand (whose traffic the plan may put anywhere: it weighs nothing in the LP). The
    same reading in stale inputs is what stale inputs are: the last weights are held."""
    ctrl = kind(2, 2)
    lat, cap = [[10.0, 60.0], [80.0, 10.0]], [200.0, 300.0]
    first = ctrl.step(_obs([150.0, 90.0], cap, lat, [True, True], now=0.0))
    with pytest.raises(ValueError, match=r"observation.demand\[1\]: expected a finite number >= 0"):
        ctrl.step(_obs([150.0, math.nan], cap, lat, [True, True], now=15.0))
    held = ctrl.step(_obs([150.0, math.nan], cap, lat, [True, True], now=30.0, age=1e4))
    assert held.stale and held.version == first.version
    np.testing.assert_array_equal(held.weights, first.weights)


def test_shortfall_and_hold_raise_findings():
    from opsloop.controllers.edge.findings import HOLD_DETECTOR, SHED_DETECTOR, decision_findings
    from opsloop.records import Finding, Severity

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


# -- hold-down, ramp-in and demand quantile, in the controller and through the live loop ------

def test_returning_origin_is_held_down_with_growing_back_off_then_ramped():
    s = ControllerSettings(interval_s=15, hold_down_intervals=2, hold_down_backoff=2,
                           hold_down_max_intervals=8, slowstart_intervals=4)
    ctrl = EdgeController(1, 2, s, initial=[[1.0, 0.0]])
    latency, cap = [[10, 80]], [400, 1000]
    t = 0.0

    def tick(near_up: bool) -> float:
        nonlocal t
        t += 15
        return ctrl.step(_obs([200], cap, latency, [near_up, True], now=t)).weights[0, 0]

    assert tick(True) == 1.0
    # flapping every interval: down moves traffic off at once, up earns nothing back
    for k in range(6):
        assert tick(k % 2 == 1) == 0.0
    # the flap count is 3 (up at three of the six ticks): hold-down 2·2² = 8 intervals
    assert ctrl.hold_down.flaps[0] == 3
    assert ctrl.hold_down.until[0] == t + 8 * 15
    shares = [tick(True) for _ in range(14)]
    # up for twice its longest up-spell (one interval): the storm is over, back without the rest of
    # the back-off and the ramp (test_flap_storm_return.py)
    assert shares[0] == 0.0 and shares[1] >= 0.5 and shares[-1] > 0.95, shares
    # not returned in one step: at most max_step a tick
    assert max(np.diff([0.0, *shares])) <= 0.5 + 1e-9 and shares[1] < 1.0


def test_one_high_reading_is_shed_only_when_the_origins_response_time_confirms_it():
    latency, cap = [[20, 150]], [200, 1000]

    def run(high_readings: int, near_ms: float, start_ms: float = 35.0,
            idle_first: bool = False) -> tuple[float, float, str]:
        """Near share before and after the high readings, and the last reason."""
        ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
        t = 0.0

        def tick(load: float, ms: float):
            nonlocal t
            t += 15
            w = ctrl.weights[0, 0]
            return ctrl.step(Observation(now=t, demand=np.array([load / w]), capacity=np.asarray(cap, float),
                                         latency=np.asarray(latency, float), healthy=np.array([True, True]),
                                         origin_latency_ms=np.array([ms, 10.0])))

        if idle_first:  # no request yet: HAProxy's rtime of a server that never answered, 0 ms
            tick(0.0, 0.0)
        tick(300, start_ms)  # overloaded at the start: are its answers seen to slow down?
        for _ in range(6):
            tick(184, 20.0)  # 92 % of capacity, answering at its unloaded speed
        before = ctrl.weights[0, 0]
        for _ in range(high_readings):
            d = tick(214, near_ms)  # read 7 % over capacity
        return before, d.weights[0, 0], d.reason

    # one reading over capacity while the origin answered at its unloaded speed: measurement noise
    before, after, reason = run(1, 20.0)
    assert "shed" not in reason and after >= before - 0.005, (before, after, reason)
    # the same reading with the origin answering slower: a real overload, shed at once
    before, after, reason = run(1, 22.0)
    assert "shed" in reason and after < before - 0.03, (before, after, reason)
    # nor a second one while it still answers at its unloaded speed
    before, after, reason = run(2, 20.0)
    assert "shed" not in reason and after >= before - 0.005, (before, after, reason)
    # an origin whose answers were never seen to slow down under overload: the reading is believed
    before, after, reason = run(1, 20.0, start_ms=20.0)
    assert "shed" in reason and after < before - 0.03, (before, after, reason)
    # an idle first interval's 0 ms is no unloaded speed (kept as one, every later answer read
    # as slowed by overload and each high reading was shed)
    before, after, reason = run(1, 20.0, idle_first=True)
    assert "shed" not in reason and after >= before - 0.005, (before, after, reason)
    before, after, reason = run(1, 22.0, idle_first=True)
    assert "shed" in reason and after < before - 0.03, (before, after, reason)


def test_a_small_overload_that_slows_the_origin_down_is_shed_at_once():
    def last(near_ms: float) -> str:
        ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
        for k in range(4):  # 90 % of capacity, answering at its unloaded 20 ms
            reading, ms = (180.0, 20.0) if k < 3 else (201.0, near_ms)  # then 0.5 % over
            d = ctrl.step(Observation(now=15.0 * (k + 1), demand=np.array([reading]),
                                      capacity=np.array([200.0, 1000.0]), latency=np.array([[20.0, 150.0]]),
                                      healthy=np.array([True, True]), origin_latency_ms=np.array([ms, 10.0])))
        return d.reason

    # within the hot margin, answers as fast as ever: eased off
    assert "easing off" in last(20.0) and "shed" not in last(20.0)
    # the same reading with answers 4 % slower: the overload is real (and hides demand): shed
    assert "shed" in last(20.8)


def test_a_reading_within_the_noise_of_capacity_is_not_eased_off_until_it_repeats():
    rng = np.random.default_rng(5)
    ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    latency, cap = [[20, 150]], [200, 1000]
    t = 0.0

    def tick(load: float):
        nonlocal t
        t += 15
        return ctrl.step(_obs([load / ctrl.weights[0, 0]], cap, latency, [True, True], now=t))

    for _ in range(12):  # 2 % measurement noise around 92 % of capacity
        tick(184 * (1 + 0.02 * rng.standard_normal()))
    assert ctrl.demand.sigma[0] > 0.005
    once = tick(201)  # 0.5 % over capacity: within one σ of the load
    assert "easing off" not in once.reason and "shed" not in once.reason, once.reason
    again = tick(201)  # over capacity a second interval running: shed
    assert "shed" in again.reason and again.weights[0, 0] < once.weights[0, 0] - 0.01, again.reason


def test_origin_back_from_a_long_outage_is_held_down_one_interval_a_flapper_two():
    s = ControllerSettings(interval_s=15, hold_down_intervals=2, hold_down_max_intervals=8,
                           outage_hold_down_intervals=1, slowstart_intervals=4)

    def held_after(down_ticks: int) -> int:
        ctrl = EdgeController(1, 2, s, initial=[[1.0, 0.0]])
        t = 0.0
        shares = []
        for up in [True] * 2 + [False] * down_ticks + [True] * 4:
            t += 15
            shares.append(ctrl.step(_obs([200], [400, 1000], [[10, 80]], [up, True], now=t)).weights[0, 0])
        back = shares[2 + down_ticks:]
        assert back[-1] > 0  # ramping in by the end either way
        return back.index(next(x for x in back if x > 0))

    # down longer than the longest hold-down (8 intervals): a repair, its first check is enough
    assert held_after(10) == 1
    # down for one interval: a flap, held down the full 2 intervals
    assert held_after(1) == 2


def test_an_origin_used_at_once_by_an_edge_with_nothing_else_stays_held_for_the_others():
    # "solo" reaches only near; "both" has near at 10 ms and far at 80 ms. Near returns: solo uses
    # it at once, both keeps off it for the hold-down (it was planned onto it, 20 points a tick)
    s = ControllerSettings(interval_s=15, hold_down_intervals=4, slowstart_intervals=2)
    ctrl = EdgeController(2, 2, s, initial=[[1.0, 0.0], [1.0, 0.0]])
    latency = [[10.0, 80.0], [10.0, INF]]
    t = 0.0

    def tick(near_up: bool):
        nonlocal t
        t += 15
        return ctrl.step(_obs([100, 100], [400, 1000], latency, [near_up, True], now=t)).weights

    tick(True)
    tick(False)
    held = [tick(True) for _ in range(4)]
    assert all(w[1, 0] == 1.0 for w in held)
    assert all(w[0, 0] == 0.0 for w in held), [w[0, 0] for w in held]
    after = [tick(True)[0, 0] for _ in range(10)]
    assert after[0] > 0 and after[-1] > 0.95   # then ramped in as usual


def test_an_edge_with_no_other_healthy_origin_is_not_held_down():
    ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    latency = [[10, math.inf]]  # the near origin is its only path
    ctrl.step(_obs([100], [400, 1000], latency, [False, True], now=15))
    back = ctrl.step(_obs([100], [400, 1000], latency, [True, True], now=30))
    assert back.weights[0, 0] == 1.0


def test_plan_follows_demand_variability_not_our_own_moves():
    rng = np.random.default_rng(4)
    noisy = EdgeController(1, 2, initial=[[1.0, 0.0]])
    steady = EdgeController(1, 2, initial=[[1.0, 0.0]])
    for k in range(14):
        draw = 1.0 + 0.12 * rng.standard_normal()
        dn = noisy.step(_obs([250 * draw], [300, 1000], [[10, 40]], [True, True], now=15 * k))
        ds = steady.step(_obs([250], [300, 1000], [[10, 40]], [True, True], now=15 * k))
    # ±12 % demand: planned on an upper quantile, so the near origin keeps more room: its
    # 95th-percentile demand stays within capacity, where the steady demand fills the plan
    assert dn.weights[0, 0] < ds.weights[0, 0]
    assert dn.weights[0, 0] * 250 * (1 + 1.645 * 0.12) <= 300 * (1 + 1e-3)
    assert "above the estimate" in dn.reason
    assert (ds.weights[0, 0] * 250) <= 300 * 0.95 + 1e-6


def test_a_rebound_seen_in_origin_response_time_is_planned_for():
    """Clients slowed by an overloaded origin come back once it is relieved: the shed allows for it."""
    blind = EdgeController(1, 2, ControllerSettings(elasticity=1.0), initial=[[1.0, 0.0]])
    seeing = EdgeController(1, 2, ControllerSettings(elasticity=1.0), initial=[[1.0, 0.0]])
    blind.step(_obs([250], [200, 1000], [[10, 40]], [True, True], now=0))
    seeing.step(Observation(now=0, demand=np.array([250.0]), capacity=np.array([200.0, 1000.0]),
                            latency=np.array([[10.0, 40.0]]), healthy=np.array([True, True]),
                            origin_latency_ms=np.array([10.0, 10.0])))
    # the near origin is overloaded: its answers take 40 ms instead of 10, clients slowed down
    kw = dict(demand=np.array([250.0]), capacity=np.array([200.0, 1000.0]),
              latency=np.array([[10.0, 40.0]]), healthy=np.array([True, True]))
    b = blind.step(Observation(now=15, **kw))
    s = seeing.step(Observation(now=15, origin_latency_ms=np.array([40.0, 10.0]), **kw))
    assert s.weights[0, 0] < b.weights[0, 0]
    with pytest.raises(ValueError, match="origin_latency_ms"):
        seeing.step(Observation(now=30, origin_latency_ms=np.array([1.0]), **kw))


def test_live_loop_gets_hold_down_and_headroom_from_the_service_settings():
    """controllers.edge.controller settings pass through the service config to the running loop."""
    from opsloop.controllers.edge.service.config import EdgeServiceSettings
    from opsloop.controllers.edge.service.inputs import DemandBook
    from opsloop.controllers.edge.service.loop import ControlLoop
    from opsloop.controllers.edge.service.store import TopologyStore
    from opsloop.audit.trail import AuditLog
    from opsloop.records import EdgeDemand, OriginState

    cfg = EdgeServiceSettings.model_validate({
        "interval_s": 1.0, "overrides_file": None,
        "controller": {"hold_down_intervals": 3, "slowstart_intervals": 2, "headroom": 0.1,
                       "stale_after_s": 5},
        "topology": {"listeners": [{
            "name": "hd", "backend": "be_hd", "edges": [{"name": "e1"}],
            "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 1000}],
            "latency_ms": {"e1": {"near": 2, "far": 30}}}]}})
    settings_ = cfg.controller_settings()
    assert settings_.hold_down_intervals == 3 and settings_.headroom == 0.1
    clock = [1_795_000_000.0]
    book = DemandBook(clock=lambda: clock[0])
    loop = ControlLoop(TopologyStore(cfg.topology, AuditLog()), book, settings_,
                       lambda recs, finds: None, None, lambda: clock[0])

    def tick(near_up: bool) -> float:
        book.update(EdgeDemand(edge="e1", backend="be_hd", demand_rps=20.0,
                               origins={"near": OriginState(rps=10.0, up=near_up),
                                        "far": OriginState(rps=10.0)}, timestamp=clock[0]))
        clock[0] += 1.0
        return loop.tick()["hd"].weights[0, 0]

    for _ in range(3):
        tick(True)
    assert tick(True) > 0.9
    flapping = [tick(k % 2 == 1) for k in range(6)]
    assert max(flapping) == 0.0   # a flapping origin earns nothing back in the live loop
    settled = [tick(True) for _ in range(16)]
    assert settled[0] == 0.0 and settled[-1] > 0.9
    assert loop.listeners["hd"].controller.hold_down.flaps[0] >= 3


def _closed_loop(ctl: EdgeController, base: float, eps: float, ticks: int, capacity=(200.0, 1000.0),
                 net=(10.0, 60.0), service=10.0) -> list[float]:
    """Clients of elasticity ``eps`` against ``ctl`` (one edge, near/far origin, unloaded origins):
    rate = base · (L_near / L)^eps. Returns the near share after each tick."""
    lat = np.array([[net[0], net[1]]])
    ref = net[0] + service
    near = []
    for k in range(ticks):
        w = ctl.weights
        mean = float((w[0] * (np.array(net) + service)).sum())
        rate = base * (ref / mean) ** eps
        d = ctl.step(Observation(now=15.0 * (k + 1), demand=np.array([rate]),
                                 capacity=np.array(capacity), latency=lat,
                                 healthy=np.array([True, True]),
                                 origin_latency_ms=np.array([service, service])))
        near.append(float(d.weights[0, 0]))
    return near


def test_elasticity_seen_across_our_moves_sets_the_target_not_the_worst_case():
    """Clients of elasticity 0.5: the first shed shows it (−Δln rate / Δln latency), and the target
    then puts the near origin at its plan for those clients; the relax step still guards with the
    worst case, so the approach never overloads it."""
    ctl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    near = _closed_loop(ctl, base=260.0, eps=0.5, ticks=14)
    assert ctl.demand.elasticity_seen()[0] == pytest.approx(0.5, abs=0.05)
    # equilibrium for eps 0.5 at the plan (190 req/s near): rate·w = 190
    w = near[-1]
    rate = 260.0 * (20.0 / (w * 20.0 + (1 - w) * 70.0)) ** 0.5
    assert rate * w == pytest.approx(190.0, rel=0.03)
    for w in near:
        r = 260.0 * (20.0 / (w * 20.0 + (1 - w) * 70.0)) ** 0.5
        assert r * w <= 200.0 * 1.0 + 1e-6


def _three_edges(rates_by_tick):
    """Demand estimates of a 3-edge controller fed these per-tick request rates (each edge on its
    own origin with room, a far origin beside them; 2 % measurement noise)."""
    rng = np.random.default_rng(7)
    ctrl = EdgeController(3, 4, initial=np.eye(3, 4))
    latency = [[5, 30, 30, 60], [30, 5, 30, 60], [30, 30, 5, 60]]
    decision = None
    for k, rates in enumerate(rates_by_tick):
        measured = np.asarray(rates, float) * (1 + 0.02 * rng.standard_normal(3))
        decision = ctrl.step(_obs(measured, [1000, 1000, 1000, 5000], latency, [True] * 4,
                                  now=15.0 * (k + 1)))
    return decision.demand_estimate, measured


def test_a_ramp_common_to_the_edges_lifts_an_edge_whose_own_rise_hid_in_its_noise():
    flat = [[200, 200, 200]] * 8
    # all three edges rise 6 % per interval; edge 2's last reading fell back (its measurement
    # noise): the median across edges still shows two rises, so edge 2 is planned a rise ahead
    ramp = flat + [[212, 212, 212], [225, 225, 200]]
    estimate, measured = _three_edges(ramp)
    assert estimate[2] > measured[2] * 1.03
    # one edge surging leaves the median flat: the other edges are planned on what they sent
    surge = flat + [[212, 200, 200], [225, 200, 200]]
    estimate, measured = _three_edges(surge)
    assert estimate[1] <= measured[1] * 1.03 and estimate[2] <= measured[2] * 1.03


def test_a_slow_ramp_common_to_the_edges_is_read_from_three_rises():
    flat = [[200, 200, 200]] * 8
    # every edge rises 4 % per interval, within reach of its 2 % measurement noise: the median
    # of the last two rises falls under the two-rise bar (1.6 % at the last), the edges'
    # three-interval rises clear theirs; each edge is planned ahead
    ramp = flat + [[208, 208, 208], [216, 216, 216], [224, 224, 224]]
    estimate, measured = _three_edges(ramp)
    assert (estimate > measured * 1.02).all()
    # one edge rising so leaves the others' rises at noise: they are planned on what they sent
    one = flat + [[208, 200, 200], [216, 200, 200], [224, 200, 200]]
    estimate, measured = _three_edges(one)
    assert estimate[1] <= measured[1] * 1.03 and estimate[2] <= measured[2] * 1.03


def test_one_edge_ramp_must_clear_the_measurement_noise_floor():
    def estimate_after(rises: list[float]) -> tuple[float, float]:
        ctrl = EdgeController(1, 2, initial=[[1.0, 0.0]])
        rates = [200.0 * (1 + 0.003 * (-1) ** k) for k in range(10)]  # calm: σ reads ~0.3 %
        for r in rises:
            rates.append(rates[-1] * (1 + r))
        for k, rate in enumerate(rates):
            d = ctrl.step(_obs([rate], [1000, 1000], [[10, 50]], [True, True], now=15.0 * (k + 1)))
        return float(d.demand_estimate[0]), rates[-1]

    # three rises of 1.8 %: above the threshold and the (low) σ read so far, but within reach of
    # a 2 % measurement noise (three draws can do that): no ramp planned ahead
    estimate, last = estimate_after([0.018, 0.018, 0.018])
    assert estimate == pytest.approx(last, rel=1e-6)
    # rises of 4 % clear it: planned an interval ahead
    estimate, last = estimate_after([0.04, 0.04, 0.04])
    assert estimate > last * 1.02


def test_a_flapper_that_then_served_healthily_for_long_returns_from_a_dip_as_a_first_flap():
    """Three flaps, then up far longer than the longest hold-down, then one dip: the return is
    held down for a first flap's hold-down (2 intervals), not the 4th flap's back-off (8)."""
    s = ControllerSettings(interval_s=15, hold_down_intervals=2, hold_down_backoff=2,
                           hold_down_max_intervals=8, slowstart_intervals=4)
    ctrl = EdgeController(1, 2, s, initial=[[1.0, 0.0]])
    t = 0.0

    def tick(near_up: bool) -> float:
        nonlocal t
        t += 15
        return ctrl.step(_obs([200], [400, 1000], [[10, 80]], [near_up, True], now=t)).weights[0, 0]

    for up in [True, False, True, False, True, False, True]:
        tick(up)
    assert ctrl.hold_down.flaps[0] == 3
    healthy = [tick(True) for _ in range(30)]   # held 8, ramped in, then serving for long
    assert healthy[-1] > 0.95
    assert tick(False) == 0.0                  # one dip
    back = [tick(True) for _ in range(6)]
    assert back[:2] == [0.0, 0.0] and back[2] > 0, back
    assert ctrl.hold_down.flaps[0] == 1


def test_fuzz_seed116_a_row_with_no_usable_origin_leaves_one_it_has_no_path_to():
    """Fuzz seed 116 (and 235): an edge whose reachable origins are all unhealthy held its share on
    an origin whose path was cut (every request there fails); fail static keeps it on the
    reachable ones instead."""
    latency = np.array([[10.0, INF, 50.0]])
    out = enforce_safety([[0.0, 0.6, 0.4]], [[0.0, 0.6, 0.4]], latency, [False, True, False], 0.5)
    np.testing.assert_allclose(out, [[0.0, 0.0, 1.0]])
    out = enforce_safety([[0.0, 1.0, 0.0]], [[0.0, 1.0, 0.0]], latency, [False, True, False], 0.5)
    np.testing.assert_allclose(out, [[1.0, 0.0, 0.0]])   # nothing reachable held: the nearest


def _shortfall_loop(ctl: EdgeController, base, net, capacity, ticks: int, service=10.0):
    """Closed-loop clients (elasticity 1) of several edges against ``ctl``, origins unloaded:
    rate = base · (nearest round trip / mean round trip). Returns each tick's load/capacity."""
    base, net, capacity = (np.asarray(x, float) for x in (base, net, capacity))
    ref = net.min(axis=1) + service
    ratios = []
    for k in range(ticks):
        w = ctl.weights
        rate = base * ref / (w * (net + service)).sum(axis=1)
        ratios.append((w * rate[:, None]).sum(axis=0) / capacity)
        ctl.step(Observation(now=15.0 * (k + 1), demand=rate, capacity=capacity, latency=net,
                             healthy=np.ones(len(capacity), bool),
                             origin_latency_ms=np.full(len(capacity), service)))
    return ratios


def test_a_shortfall_is_planned_on_what_elastic_clients_send_at_the_plans_weights():
    """Demand above all capacity, an edge half on a far origin sends half its demand: planned on
    that, its share all went back to its near origin, which its clients then overloaded 2.3x
    while the other origin ran at 1.0x (then 0.9x / 1.4x and back, for good). Planned on what
    they send at the plan's weights, both origins carry the common overload factor at once."""
    ctl = EdgeController(2, 2, initial=[[0.5, 0.5], [0.0, 1.0]])
    ratios = _shortfall_loop(ctl, base=[200.0, 400.0], net=[[10.0, 60.0], [60.0, 10.0]],
                             capacity=[100.0, 300.0], ticks=8)
    for r in ratios[1:]:
        assert abs(r[0] / r[1] - 1.0) < 0.05, ratios


def test_a_mesh_shortfall_plan_agrees_with_what_its_clients_send_within_three_intervals():
    """Four edges each on its own near origin, demand 2.16x (123 % of all capacity), closed-loop
    clients. The plan's shares jump with the demand it is made on; averaged rounds stopped on a
    plan whose edges sent a third less than it was made on, and the origins stayed 9-20 %
    apart for seven intervals. Bracketed per edge, the plan's demand covers what its clients
    send: every origin within 5 % of the others from the third interval on."""
    net = [[29.8, 82.5, 26.1, 9.2], [6.5, 107.1, 52.1, 36.4], [55.7, 69.1, 7.7, 24.8],
           [104.5, 5.0, 73.7, 76.2]]
    ctl = EdgeController(4, 4, initial=[[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0]])
    base = np.array([295.1, 273.0, 137.4, 216.8]) * 2.16
    ratios = _shortfall_loop(ctl, base=base, net=net, capacity=[371.5, 345.0, 204.8, 382.4],
                             ticks=10)
    assert ratios[0].max() / ratios[0].min() > 1.15  # the edges' own origins start far apart
    for r in ratios[3:]:
        assert r.max() / r.min() < 1.05, [np.round(x, 2) for x in ratios]


def test_a_demand_step_still_settling_when_we_move_is_not_read_as_the_clients_elasticity():
    """Demand steps up mid-interval: the first measurement shows part of it, the shed that follows
    (a move of ours) comes with the rest of the rise. Closed-loop clients read 0.3 from that
    (−Δln rate / Δln latency); the shortfall plan then put their edge back on its near origin."""
    ctl = EdgeController(1, 2, initial=[[1.0, 0.0]])
    lat = np.array([[10.0, 60.0]])

    def tick(k: int, rate: float):
        return ctl.step(Observation(now=15.0 * k, demand=np.array([rate]),
                                    capacity=np.array([200.0, 1000.0]), latency=lat,
                                    healthy=np.array([True, True]),
                                    origin_latency_ms=np.array([10.0, 10.0])))
    for k in range(1, 4):
        tick(k, 150.0)
    d = tick(4, 230.0)          # part of a step to 300 req/s: shed at once
    w = d.weights[0, 0]
    assert w < 0.95
    mean = w * 20.0 + (1 - w) * 70.0
    tick(5, 300.0 * 20.0 / mean)  # the rest of the step, at the latency of the shed
    assert not ctl.demand.elasticity_obs[0]
    assert ctl.demand.elasticity_seen()[0] == 1.0
