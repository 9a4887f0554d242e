"""The LP scheduler: correct assignments, the safety rules over random inputs, never worse than greedy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings

from opsloop.controllers.edge.scheduler import MIN_RATE, SchedulerError, greedy, solve
from tests.controllers.edge.test_strategies import problems

INF = math.inf


def test_nearest_origin_when_there_is_room():
    sol = solve([100, 100], [500, 500], [[10, 80], [80, 10]], [True, True])
    assert sol.status == "optimal"
    np.testing.assert_allclose(sol.weights, [[1, 0], [0, 1]], atol=1e-9)
    assert sol.shortfall_rps == 0


def test_us_eu_experiment_offloads_the_excess_to_the_far_origin():
    # "Building A Smarter AWS Global Accelerator": US origin capped at 200 req/s, EU further away; 300 req/s arriving near US
    sol = solve([300], [200, 1000], [[20, 150]], [True, True], headroom=0.0)
    np.testing.assert_allclose(sol.weights, [[200 / 300, 100 / 300]], atol=1e-7)
    sol = solve([300], [200, 1000], [[20, 150]], [True, True], headroom=0.1)
    assert sol.weights[0, 0] * 300 == pytest.approx(180, abs=1e-5)


def test_amsterdam_example_from_the_accelerator_post():
    # EU at capacity: Amsterdam sends 90 % to EU and 10 % to the next closest (US-EAST)
    origins = ["eu", "us-west", "us-east", "asia"]
    latency = [[10, 150, 80, 200], [80, 70, 8, 190]]
    sol = solve([1000, 500], [900, 2000, 2000, 2000], latency, [True] * 4, headroom=0.0)
    row = dict(zip(origins, sol.weights[0]))
    assert row["eu"] == pytest.approx(0.9, abs=1e-7) and row["us-east"] == pytest.approx(0.1, abs=1e-7)
    assert sol.weights[1, 2] == pytest.approx(1.0)


def test_shortage_sheds_the_same_fraction_everywhere():
    sol = solve([100, 300], [100, 100], [[10, 50], [50, 10]], [True, True], headroom=0.0)
    assert sol.status == "shed"
    assert sol.served_fraction == pytest.approx(0.5)
    np.testing.assert_allclose(sol.served / np.array([100, 300]), [0.5, 0.5], atol=1e-7)
    assert sol.shortfall_rps == pytest.approx(200)
    load = (sol.weights * np.array([100, 300])[:, None]).sum(axis=0)
    np.testing.assert_allclose(load / 100, [2.0, 2.0], atol=1e-6)  # every origin overloaded alike


def test_shortage_with_partial_reach_serves_every_edge_at_least_the_common_fraction():
    sol = solve([100, 300], [100, 100], [[10, INF], [50, 10]], [True, True], headroom=0.0)
    assert sol.served_fraction == pytest.approx(0.5, abs=1e-6)
    assert (sol.served >= 0.5 * np.array([100, 300]) - 1e-5).all()
    assert sol.served.sum() == pytest.approx(200, abs=1e-5)
    assert sol.weights[0, 1] == 0  # no path


def test_unhealthy_origin_gets_nothing():
    sol = solve([100], [500, 500], [[10, 80]], [False, True])
    np.testing.assert_allclose(sol.weights, [[0, 1]])


def test_nothing_healthy_holds_previous_or_falls_back():
    held = solve([100], [500, 500], [[10, 80]], [False, False], previous=[[0.3, 0.7]])
    assert held.status == "hold" and held.held_edges == [0]
    np.testing.assert_allclose(held.weights, [[0.3, 0.7]])
    fallback = solve([100], [100, 300], [[10, 80]], [False, False])
    assert fallback.status == "fallback" and fallback.fallback_edges == [0]
    np.testing.assert_allclose(fallback.weights, [[0.25, 0.75]])  # by capacity


def test_nothing_healthy_reports_nothing_served_and_names_the_edges():
    # every origin unhealthy: the weights held are no service, the report must not say "served 1.000"
    sol = solve([100, 50], [200, 300], [[10, 20], [15, INF]], [False, False], previous=[[0.5, 0.5], [1, 0]])
    assert sol.served_fraction == 0.0 and sol.shortfall_rps == pytest.approx(150)
    assert sol.message == ("served fraction 0.000, shortfall 150.0 req/s; no healthy origin; nothing served at "
                           "edge(s) [0, 1] (150.0 req/s): no usable origin; edge(s) [0, 1] hold their previous weights")
    fallback = solve([100], [100, 300], [[10, 80]], [False, False])
    assert fallback.served_fraction == 0.0
    assert "nothing served at edge(s) [0] (100.0 req/s)" in fallback.message
    assert "edge(s) [0] spread over their reachable origins by capacity" in fallback.message


def test_an_edge_without_usable_origin_counts_as_unserved():
    # edge 1 reaches only the unhealthy origin: the other edge is fully served, the total is not
    sol = solve([100, 50], [200, 300], [[10, INF], [INF, 15]], [True, False], previous=[[1, 0], [0, 1]])
    assert sol.status == "hold" and sol.held_edges == [1]
    assert sol.served.tolist() == pytest.approx([100, 0])
    assert sol.served_fraction == pytest.approx(100 / 150)
    assert "no healthy origin" not in sol.message
    assert "nothing served at edge(s) [1] (50.0 req/s): no usable origin" in sol.message
    # an idle edge without a usable origin loses nothing
    idle = solve([100, 0], [200, 300], [[10, INF], [INF, 15]], [True, False], previous=[[1, 0], [0, 1]])
    assert idle.served_fraction == 1.0 and "nothing served" not in idle.message


def test_idle_edge_gets_nearest_origin_with_room():
    sol = solve([0, 500], [500, 500], [[10, 80], [10, 80]], [True, True], headroom=0.0)
    np.testing.assert_allclose(sol.weights[0], [0, 1])  # nearest (origin 0) is full
    assert sol.weights.sum(axis=1).tolist() == [1.0, 1.0]


def test_tie_break_prefers_previous_weights():
    for prev in ([[1.0, 0.0]], [[0.0, 1.0]]):
        sol = solve([100], [500, 500], [[20, 20]], [True, True], previous=prev)
        np.testing.assert_allclose(sol.weights, prev)


@pytest.mark.parametrize("args, needle", [
    (([1, -2], [1], [[1], [1]], [True]), "demand[1]: expected a finite number >= 0, got -2.0"),
    (([1], [float("nan")], [[1]], [True]), "capacity[0]"),
    (([1], [1], [[1, 2]], [True]), "latency: expected shape (1, 1)"),
    (([1], [1], [[-1]], [True]), "latency[0, 0]: expected >= 0 ms"),
    # finite but beyond what the LP takes as a number (HiGHS: 1e20 and up is infinite)
    (([1e300], [1], [[1]], [True]), "demand[0]: expected at most 1e+12 req/s, got 1e+300"),
    (([1], [1, 1e13], [[1, 1]], [True, True]), "capacity[1]: expected at most 1e+12 req/s"),
    (([1], [1], [[1e300]], [True]), "latency[0, 0]: expected at most 1e+09 ms (inf: no path)"),
    (([1], [1], [[1]], [True, False]), "healthy: expected shape (1,)"),
    (([], [1], [[1]], [True]), "need at least one edge and one origin"),
    ((["x"], [1], [[1]], [True]), "demand: not a numeric array"),
])
def test_bad_inputs_name_what_is_wrong(args, needle):
    with pytest.raises(SchedulerError) as err:
        solve(*args)
    assert needle in str(err.value)


def test_bad_headroom_and_previous():
    with pytest.raises(SchedulerError, match="headroom"):
        solve([1], [1], [[1]], [True], headroom=1.0)
    with pytest.raises(SchedulerError, match="previous"):
        solve([1], [1], [[1]], [True], previous=[[-1.0]])


@settings(max_examples=150, deadline=None)
@given(problems())
def test_safety_rules_hold_for_random_inputs(problem):
    demand, capacity, latency, healthy, previous = problem
    for prev in (None, previous):
        sol = solve(demand, capacity, latency, healthy, previous=prev, headroom=0.05)
        w = sol.weights
        # shares sum to 100 %, never negative, never an all-zero edge
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-9)
        assert (w >= 0).all()
        usable = np.isfinite(latency) & healthy[None, :]
        for e in range(len(demand)):
            if usable[e].any():
                # nothing to an unhealthy/unreachable origin while a healthy one is reachable
                assert w[e][~usable[e]].sum() == 0
        # capacity respected when feasible: all healthy origins reachable by all edges, enough room
        live = usable.any(axis=0)
        if usable[:, live].all() and live.any() and demand.sum() <= (capacity[live] * 0.95).sum():
            load = (w * demand[:, None]).sum(axis=0)
            assert (load <= capacity * 0.95 * (1 + 1e-6) + 1e-6).all()
            assert sol.shortfall_rps == 0


@settings(max_examples=100, deadline=None)
@given(problems(allow_unhealthy=True))
def test_never_worse_than_greedy(problem):
    demand, capacity, latency, healthy, _ = problem
    lp = solve(demand, capacity, latency, healthy, headroom=0.05)
    nf = greedy(demand, capacity, latency, healthy, headroom=0.05)
    if nf.shortfall_rps == 0:
        # capacity suffices: the LP is the optimum, greedy one feasible point
        assert lp.shortfall_rps == pytest.approx(0, abs=1e-5 * max(1, demand.sum()))
        assert lp.objective <= nf.objective * (1 + 1e-6) + 1e-4
    else:
        # shortage: the LP never serves less in total (it also shares the shortfall fairly)
        assert lp.served.sum() >= nf.served.sum() * (1 - 1e-6) - 1e-4


@settings(max_examples=60, deadline=None)
@given(problems(max_edges=8, max_origins=6, allow_unreachable=False, allow_unhealthy=False))
def test_shortage_rule_is_proportional(problem):
    demand, capacity, latency, healthy, _ = problem
    # rates below MIN_RATE count as zero (documented)
    demand = np.where(demand < MIN_RATE, 0.0, demand)
    capacity = np.where(capacity < MIN_RATE, 0.0, capacity)
    assume(demand.sum() > capacity.sum() * 0.95 + 1e-3 and capacity.sum() > 0)
    sol = solve(demand, capacity, latency, healthy, headroom=0.05)
    t = capacity.sum() * 0.95 / demand.sum()
    assert sol.served_fraction == pytest.approx(t, rel=1e-9)
    np.testing.assert_allclose(sol.served, demand * t, rtol=1e-6, atol=1e-5)


def test_large_problem_is_optimal_against_greedy():
    rng = np.random.default_rng(7)
    n_edges, n_origins = 300, 30
    latency = rng.uniform(1, 200, (n_edges, n_origins))
    capacity = rng.uniform(50, 300, n_origins)
    demand = rng.dirichlet(np.ones(n_edges)) * capacity.sum() * 0.8
    lp = solve(demand, capacity, latency, np.ones(n_origins, bool))
    nf = greedy(demand, capacity, latency, np.ones(n_origins, bool))
    assert lp.status == "optimal" and nf.shortfall_rps == pytest.approx(0, abs=1e-6)
    assert lp.objective < nf.objective  # strictly better on a congested random instance
    load = (lp.weights * demand[:, None]).sum(axis=0)
    assert (load <= capacity * 0.95 * (1 + 1e-6)).all()


def _full_lp_objective(demand, capacity, latency, headroom):
    """The same program solved in one piece, without column generation (reference)."""
    from scipy.optimize import linprog
    n_edges, n_origins = latency.shape
    a_eq = np.kron(np.eye(n_edges), np.ones(n_origins))
    a_ub = np.kron(np.ones(n_edges), np.eye(n_origins))
    res = linprog(latency.ravel(), A_ub=a_ub, b_ub=capacity * (1 - headroom), A_eq=a_eq,
                  b_eq=demand, bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("load_factor", [0.3, 0.8, 0.99])
def test_column_generation_matches_the_full_program(load_factor):
    rng = np.random.default_rng(int(load_factor * 100))
    for _ in range(5):
        n_edges, n_origins = rng.integers(5, 40), rng.integers(9, 30)  # more origins than the start set
        latency = rng.uniform(1, 200, (n_edges, n_origins))
        capacity = rng.uniform(10, 300, n_origins)
        demand = rng.dirichlet(np.ones(n_edges)) * capacity.sum() * 0.95 * load_factor
        sol = solve(demand, capacity, latency, np.ones(n_origins, bool), headroom=0.05)
        assert sol.status == "optimal"
        assert sol.objective == pytest.approx(_full_lp_objective(demand, capacity, latency, 0.05),
                                              rel=1e-7, abs=1e-6)


@pytest.mark.parametrize("capacity", [[1e-7, 1e-7], [5e-7, 2e-6], [1e-300, 3e-6]])
def test_rates_at_the_solver_tolerance_do_not_break_it(capacity):
    # found by fuzzing the simulator: capacities near HiGHS' feasibility tolerance
    sol = solve([1.0], capacity, [[1.0, 1.0]], [True, True])
    np.testing.assert_allclose(sol.weights.sum(axis=1), 1.0)
    assert sol.shortfall_rps == pytest.approx(1.0, abs=1e-5)
    assert sol.status == "shed"
