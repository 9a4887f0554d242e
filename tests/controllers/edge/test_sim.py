"""The closed-loop simulator: shipped scenarios meet the targets for our controller and show the
fixed-step baseline (2 % per interval) slower, in the same run (simulated time only, no wall clock)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from opsloop.controllers.edge.sim import Scenario, ScenarioError, load_scenario, run_scenario, simulate
from opsloop.controllers.edge.sim_cli import main
from tests.helpers import REPO

SCENARIOS = REPO / "controllers" / "edge" / "scenarios"
SHIPPED = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
# Named misses of the control targets on our own scenarios (also in controllers/edge/README.md):
# none. noise_near_capacity (demand redrawn every interval, sd 10 %, at 95 % of the near origin)
# is met on its own seed by chance: one window of upward draws at 165 s reads as a 3 %-an-interval
# ramp of the edge's own level and lifts the plan for an interval; the shares after it differ, and
# the draw at 300 s that ran 15 s over capacity before now lands within it. Other seeds of it
# still miss (test_seed_sweep.py): with independent draws the plan covers the 95th percentile,
# and the 99th, which a tenth of the baselines' overload needs, costs ~20 % mean latency, over
# the 1.10 budget.
OVERLOAD_SLACK: dict[str, float] = {}
WEIGHT_SWING_SLACK: dict[str, float] = {}
NAMED: dict[str, tuple[str, ...]] = {}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in SHIPPED:
        scn = load_scenario(SCENARIOS / f"{name}.yaml")
        out[name] = (scn, *run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom", "undamped"]))
    return out


def test_the_eight_kinds_are_shipped():
    assert {"us_eu_experiment", "origin_failure", "mesh_peak", "shortfall", "surge_one_edge",
            "noise_near_capacity", "flapping_origin", "capacity_halved"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_ours_meets_the_control_targets(results, name):
    scn, summaries, _ = results[name]
    ours = summaries["ours"]
    named = NAMED.get(name, ())
    assert not [v for v in ours["violations"] if not v.startswith(named)], ours["violations"]
    for miss in named:  # a named miss that is gone must leave the list
        assert any(v.startswith(miss) for v in ours["violations"]), f"{name}: {miss!r} now holds"
    limit = scn.targets.capacity_within_intervals * scn.interval_s
    for phase in ours["phases"]:
        m = phase["metrics"]
        long = phase["end_s"] - phase["start_s"] >= limit + scn.interval_s
        if long and scn.demand_noise == 0:
            assert m["time_to_capacity_s"] is not None and m["time_to_capacity_s"] <= limit
            assert m["overshoot"] is not None and m["overshoot"] <= 0.05
        assert m["oscillation_weight"] <= WEIGHT_SWING_SLACK.get(name, scn.targets.oscillation_weight)
    assert ours["excess_p95"] <= 0.05 and ours["churn"] <= 0.03


@pytest.mark.parametrize("name", SHIPPED)
def test_against_both_fixed_step_baselines_in_the_same_run(results, name):
    _, summaries, _ = results[name]
    ours = summaries["ours"]
    for kind in ("fixed-step", "fixed-step-headroom"):
        base = summaries[kind]
        # overload after the first tick: ≤ 10 % of the baseline's (+ the scenario's slack)
        assert ours["judged_overload_s"] <= OVERLOAD_SLACK.get(name, 0.10) \
            * base["judged_overload_s"] + results[name][0].targets.overload_slack_s + 1e-9
        assert ours["mean_latency_feasible_ms"] <= 1.10 * base["mean_latency_feasible_ms"]
    assert set(ours["baselines"]) == {"fixed-step", "fixed-step-headroom"}


def test_fixed_step_is_slower_in_the_same_run(results):
    for name in ("us_eu_experiment", "origin_failure", "demand_surge", "capacity_drop"):
        _, summaries, _ = results[name]
        ours, fixed = summaries["ours"], summaries["fixed-step"]
        assert not fixed["meets_targets"]
        assert sum(fixed["overload_s"].values()) > 3 * sum(ours["overload_s"].values())
        fixed_t = fixed["time_to_capacity_s"]
        assert fixed_t is None or fixed_t > ours["time_to_capacity_s"]


def test_flapping_origin_is_held_down_and_ramped_back(results):
    scn, summaries, runs = results["flapping_origin"]
    run, fra = runs["ours"], 0
    share = run.tick_weights[1:, :, fra].max(axis=1)
    flapping = (run.tick_times > 165) & (run.tick_times < 480)
    # while it flaps it earns nothing back; it returns after the last flap, once up for twice its
    # longest up-spell (test_flap_storm_return.py), at most max_step a tick (not at once)
    assert share[flapping].max() == 0
    back = share[run.tick_times >= 480]
    assert back[-1] > 0.5
    assert np.diff(back).max() <= 0.5 + 1e-9
    assert any("holding down returning origin" in r for r in run.tick_reasons)
    assert summaries["ours"]["failed_requests"] < summaries["fixed-step"]["failed_requests"]


def test_shortfall_is_shared_by_the_common_factor(results):
    scn, summaries, runs = results["shortfall"]
    short = [p for p in summaries["ours"]["phases"] if not p["metrics"]["feasible"]]
    assert short, "the scenario must have a shortfall phase"
    m = short[0]["metrics"]
    assert m["time_to_capacity_s"] is not None \
        and m["time_to_capacity_s"] <= 1.5 * scn.interval_s + scn.interval_s
    run = runs["ours"]
    end = short[0]["end_s"]
    i = int(end / scn.dt_s) - 1
    ratio = run.loads[i] / run.capacity[i]
    common = run.loads[i].sum() / run.capacity[i].sum()
    assert ratio.max() <= common * 1.05


def test_us_eu_experiment_reproduces_the_accelerator_observations(results):
    # "Building A Smarter AWS Global Accelerator" (docs/sources.md)
    scn, summaries, runs = results["us_eu_experiment"]
    ours, undamped = summaries["ours"], summaries["undamped"]
    # undamped never settles (the post: "the system never stabilized"), ours does
    assert undamped["settle_s"] is None and undamped["oscillation_weight"] > 0.1
    assert ours["settle_s"] is not None and ours["oscillation_weight"] <= 0.02
    # clients react to latency: offloading to EU lowered the request rate
    rates = runs["ours"].rates[:, 0]
    assert rates[-1] < rates[0]
    # the US origin ends near (not above) its 200 req/s cap, the rest goes to EU
    us_load = runs["ours"].loads[-1, 0]
    assert 0.85 * 200 <= us_load <= 200
    assert runs["ours"].tick_weights[-1, 0, 1] > 0.05
    # the fixed-step baseline moves 2 % per interval at most
    fixed_w = runs["fixed-step"].tick_weights[:, 0, 0]
    assert np.abs(np.diff(fixed_w)).max() <= 0.02 + 1e-9


def test_origin_failure_moves_traffic_in_one_interval_and_back(results):
    scn, _, runs = results["origin_failure"]
    run = runs["ours"]
    east = [o.name for o in scn.origins].index("us-east")
    fail_tick = int(np.searchsorted(run.tick_times, 150.0, side="right"))  # first tick after failure
    assert run.tick_weights[fail_tick + 1, :, east].max() == 0  # share to zero within one interval
    # during the failure nothing goes to us-east; after recovery traffic returns
    recovered = run.tick_weights[-1, 0, east]
    assert recovered > 0.9
    # telemetry stale at 480 s: the controller held and said so
    assert "hold" in run.tick_modes
    held = [i for i, m in enumerate(run.tick_modes) if m == "hold"]
    for i in held:
        np.testing.assert_array_equal(run.tick_weights[i + 1], run.tick_weights[i])
        assert "stale inputs" in run.tick_reasons[i]


def test_older_baseline_names_are_still_accepted():
    # kind 'seed' and key 'seed_controller' were the fixed-step baseline's names before
    doc = yaml.safe_load((SCENARIOS / "demand_surge.yaml").read_text())
    doc["seed_controller"] = {"step": 0.05}
    scn = Scenario.model_validate(doc)
    assert scn.fixed_step.step == 0.05
    np.testing.assert_array_equal(simulate(scn, "seed").tick_weights, simulate(scn, "fixed-step").tick_weights)


def test_simulation_is_deterministic():
    scn = load_scenario(SCENARIOS / "demand_surge.yaml")
    a, b = simulate(scn, "ours"), simulate(scn, "ours")
    np.testing.assert_array_equal(a.loads, b.loads)
    np.testing.assert_array_equal(a.tick_weights, b.tick_weights)


def test_cli_table_json_and_plot(tmp_path, capsys):
    scenario = str(SCENARIOS / "us_eu_experiment.yaml")
    assert main(["--scenario", scenario]) == 0  # meets every target, against both baselines
    table = capsys.readouterr().out
    assert "ours" in table and "fixed-step" in table and "vs fixed-step-headroom" in table
    png = tmp_path / "out.png"
    assert main(["--scenario", scenario, "--json", "--plot", str(png),
                 "--controllers", "ours,seed"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["controllers"]) == {"ours", "seed"}  # the older name 'seed' still names the fixed-step one
    traj = doc["controllers"]["ours"]["trajectories"]
    assert len(traj["origin_healthy"]["us"]) == len(traj["time_s"])
    assert doc["controllers"]["ours"]["served_within_capacity"] > 0
    assert len(traj["tick_s"]) == len(traj["weights"]["sjc"]["us"])
    assert all(abs(u + e - 1) < 1e-5 for u, e in zip(traj["weights"]["sjc"]["us"],
                                                      traj["weights"]["sjc"]["eu"]))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["demand_surge", "capacity_drop"])
def test_json_modes_and_reasons_line_up_with_the_ticks_weights(name, capsys):
    """Entry k of ``modes`` and ``reasons`` is the decision that set ``weights`` entry k (at ``tick_s``
    entry k; entry 0 the starting weights): "at target" leaves them as they were, "shed off" moves
    them. One entry off (as before: no entry for the start), a shed read beside the tick before it."""
    main(["--scenario", str(SCENARIOS / f"{name}.yaml"), "--json", "--controllers", "ours"])
    traj = json.loads(capsys.readouterr().out)["controllers"]["ours"]["trajectories"]
    weights, reasons = traj["weights"], traj["reasons"]
    assert len(traj["tick_s"]) == len(reasons) == len(traj["modes"])
    assert traj["modes"][0] == "initial"

    def moved(k: int) -> bool:
        return any(abs(w[k] - w[k - 1]) > 1e-6 for row in weights.values() for w in row.values())
    held = [k for k in range(1, len(reasons)) if reasons[k].startswith("at target")]
    shed = [k for k in range(1, len(reasons)) if reasons[k].startswith("shed off")]
    assert held and shed
    assert not any(moved(k) for k in held), [traj["tick_s"][k] for k in held if moved(k)]
    assert all(moved(k) for k in shed), [traj["tick_s"][k] for k in shed if not moved(k)]


def test_cli_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "examples:" in capsys.readouterr().out


def _write(tmp_path, doc) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return str(path)


def _minimal():
    return {"name": "t", "duration_s": 60, "origins": [{"name": "a", "capacity_rps": 10}],
            "edges": [{"name": "e", "base_rps": 5, "latency_ms": {"a": 10}}]}


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["edges"][0]["latency_ms"].update({"zz": 3}), "unknown origin 'zz'"),
    (lambda d: d.update(events=[{"at": 10, "demand": {"nope": 3}}]), "unknown edge 'nope'"),
    (lambda d: d.update(events=[{"at": 10}]), "changes nothing"),
    (lambda d: d.update(events=[{"at": 100, "demand_scale": 2}]), "after duration_s"),
    (lambda d: d.update(interval_s=7.5, dt_s=2), "interval_s: must be a multiple of dt_s"),
    (lambda d: d.update(controllers=["pid"]), "unknown controller 'pid'"),
    (lambda d: d["origins"][0].update(capacity_rps=-1), "origins.0.capacity_rps"),
    (lambda d: d.update(controller={"headroom": 2}), "controller.headroom"),
])
def test_bad_scenarios_name_the_field(tmp_path, capsys, mutate, needle):
    doc = _minimal()
    mutate(doc)
    with pytest.raises(ScenarioError) as err:
        load_scenario(_write(tmp_path, doc))
    assert needle in str(err.value)
    assert main(["--scenario", _write(tmp_path, doc)]) == 2
    assert needle in capsys.readouterr().err


def test_unreadable_and_non_yaml_scenarios(tmp_path, capsys):
    assert main(["--scenario", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["--scenario", _write(tmp_path, "a: [unclosed")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["--scenario", _write(tmp_path, "- 1\n- 2\n")]) == 2
    assert "mapping" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_scenario_loader_fuzz(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_text(text)
    try:
        load_scenario(path)
    except ScenarioError as exc:
        assert str(path) in str(exc)


def test_readme_scenario_example_is_valid_and_runs(tmp_path):
    readme = (SCENARIOS.parent / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text(block)
    scn = load_scenario(path)
    summaries, _ = run_scenario(scn)
    assert set(summaries) == {"ours", "fixed-step"}
    assert len(summaries["ours"]["phases"]) == 7  # start + 6 plant-changing events
    assert set(summaries["ours"]["baselines"]) == {"fixed-step", "fixed-step-headroom"}


@st.composite
def _random_scenarios(draw):
    n_o = draw(st.integers(1, 3))
    n_e = draw(st.integers(1, 3))
    origins = [{"name": f"o{j}", "capacity_rps": draw(st.floats(0, 500)),
                "healthy": draw(st.booleans())} for j in range(n_o)]
    edges = [{"name": f"e{i}", "base_rps": draw(st.floats(0, 600)),
              "elasticity": draw(st.sampled_from([0.0, 0.5, 1.0])),
              "latency_ms": {f"o{j}": draw(st.floats(1, 200)) for j in range(n_o)}}
             for i in range(n_e)]
    events = [{"at": float(draw(st.integers(0, 119))),
               "health": {f"o{draw(st.integers(0, n_o - 1))}": draw(st.booleans())},
               "demand_scale": draw(st.floats(0.1, 3.0))} for _ in range(draw(st.integers(0, 3)))]
    return {"name": "random", "duration_s": 120, "noise": 0.05, "origins": origins, "edges": edges,
            "events": events, "controllers": ["ours", "fixed-step", "undamped"]}


@settings(max_examples=15, deadline=None)
@given(_random_scenarios())
def test_random_scenarios_keep_the_safety_rules_in_closed_loop(doc):
    from opsloop.controllers.edge.sim import Scenario
    scn = Scenario.model_validate(doc)
    for kind in scn.controllers:
        run = simulate(scn, kind)
        weights = run.tick_weights[1:]
        np.testing.assert_allclose(weights.sum(axis=2), 1.0, atol=1e-9)
        for k, t in enumerate(run.tick_times):
            healthy = run.healthy[int(round(t / scn.dt_s)) - 1]
            if healthy.any() and run.tick_modes[k] != "hold":
                assert weights[k][:, ~healthy].sum() == 0


def test_a_flap_phase_too_short_to_settle_is_not_judged_as_oscillation():
    # b is down 30 s, up 30 s: each phase is shorter than the 3-interval settling allowance, so
    # its last intervals hold the forced move off b and its correction, which reverse direction;
    # that is the step's transient, judged by the run's churn, not a sustained oscillation
    scn = load_scenario(SCENARIOS / "robustness" / "flap_two_interval_period.yaml")
    summaries, _ = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours = summaries["ours"]
    swung = [p for p in ours["phases"] if p["metrics"]["oscillation_weight"] > 0.03]
    assert swung, "the forced move off the flapping origin shows in the phase metric"
    assert all(p["end_s"] - p["start_s"] < 4 * scn.interval_s for p in swung)
    assert not [v for v in ours["violations"] if "oscillate" in v]
    assert ours["churn"] <= scn.targets.churn
    # a phase long enough to settle is still judged on its swings: draws held 30 s, which the
    # plan chases (weights swing ~14 points)
    noise = load_scenario(SCENARIOS / "robustness" / "noise_two_edges.yaml")
    noisy, _ = run_scenario(noise, ["ours", "fixed-step", "fixed-step-headroom"])
    assert any("weights oscillate" in v for v in noisy["ours"]["violations"])


def test_latency_is_compared_on_the_phases_outside_a_shortfall_in_both_runs():
    """Demand ×3.3 on closed-loop clients, 113 % of all capacity: ours moves two edges to the far
    origin, their clients slow down and the shortfall is gone (the phase counts as feasible for
    ours), while the fixed-step baseline keeps everything on the near origin, overloaded (a
    shortfall phase for it). Judged on each run's own feasible phases, ours' far-moved clients
    were compared with the baseline's pre-surge start alone (37.2 vs 19.6 ms, "1.90x"); the
    comparison takes the phases both ran outside a shortfall."""
    scn = Scenario.model_validate({
        "name": "shortfall_relieved_by_elastic_clients", "interval_s": 10, "duration_s": 380,
        "dt_s": 1, "seed": 2071327542, "noise": 0.027, "client_tau_s": 1.0,
        "overload_slowdown": 1.43, "controllers": ["ours", "fixed-step"],
        "origins": [{"name": "o1", "capacity_rps": 1058.5, "service_ms": 12.3},
                    {"name": "o2", "capacity_rps": 317.6, "service_ms": 6.4}],
        "edges": [{"name": f"e{i}", "base_rps": rps, "elasticity": el,
                   "latency_ms": {"o1": near, "o2": far}}
                  for i, (rps, el, near, far) in enumerate(
                      [(157.3, 0.92, 5.3, 120.8), (181.6, 0.65, 8.6, 125.7),
                       (181.6, 0.73, 8.9, 128.1), (275.4, 1.0, 6.4, 120.6)], start=1)],
        "events": [{"at": 119, "label": "surge", "demand_scale": 3.2891, "ramp_s": 20}]})
    summaries, _ = run_scenario(scn, ["ours", "fixed-step"])
    ours, base = summaries["ours"], summaries["fixed-step"]
    feasible = [(p["metrics"]["feasible"], q["metrics"]["feasible"])
                for p, q in zip(ours["phases"], base["phases"])]
    assert feasible == [(True, True), (True, False)]       # the surge: a shortfall for one run only
    start_ours, start_base = ours["phases"][0]["metrics"], base["phases"][0]["metrics"]
    compared = ours["baselines"]["fixed-step"]["mean_latency_compared_ms"]
    assert compared["ours"] == pytest.approx(start_ours["request_ms"] / start_ours["requests"])
    assert compared["fixed-step"] == pytest.approx(start_base["request_ms"] / start_base["requests"])
    # each run's own feasible phases would compare different windows
    assert ours["mean_latency_feasible_ms"] > 1.5 * base["mean_latency_feasible_ms"]
    assert not [v for v in ours["violations"] if "mean latency" in v], ours["violations"]


def _ramp_scenario(events: list[dict]) -> Scenario:
    return Scenario.model_validate({
        "name": "ramp-and-events", "interval_s": 10, "dt_s": 1, "duration_s": 200, "client_tau_s": 0,
        "controllers": ["fixed-step"],
        "origins": [{"name": "a", "capacity_rps": 1000, "service_ms": 5},
                    {"name": "b", "capacity_rps": 1000, "service_ms": 5}],
        "edges": [{"name": "e", "base_rps": 100, "elasticity": 0.0, "latency_ms": {"a": 10, "b": 50}},
                  {"name": "f", "base_rps": 50, "elasticity": 0.0, "latency_ms": {"a": 50, "b": 10}}],
        "events": [{"at": 60, "demand_scale": 3, "ramp_s": 100}, *events]})


@pytest.mark.parametrize("event, e_at_100, f_at_100", [
    ({"at": 90, "capacity": {"b": 900}}, 100 + 200 * 0.4, 50 + 100 * 0.4),    # no demand change: the ramp goes on
    ({"at": 90, "health": {"b": False}}, 100 + 200 * 0.4, 50 + 100 * 0.4),
    ({"at": 90, "latency": {"e": {"b": 60}}}, 100 + 200 * 0.4, 50 + 100 * 0.4),
    # a step during the ramp moves the ramp with it (now and its end); an edge set to a rate leaves it
    ({"at": 90, "demand_scale": 2}, 2 * (100 + 200 * 0.4), 2 * (50 + 100 * 0.4)),
    ({"at": 90, "demand": {"f": 70}}, 100 + 200 * 0.4, 70),
])
def test_an_event_during_a_demand_ramp_leaves_the_ramp_going(event, e_at_100, f_at_100):
    """Old plant: any event during a ramp (a capacity, health or latency change too) put the demand at once at the
    ramp's end: 300 req/s at t=90 where the ramp had reached 190."""
    run = simulate(_ramp_scenario([event]), "fixed-step")
    at = int(np.searchsorted(run.times, 100.0))   # the step ending at t=100 s: 40 s into the 100 s ramp
    assert run.rates[at] == pytest.approx([e_at_100, f_at_100], rel=1e-6)
    end = int(np.searchsorted(run.times, 170.0))   # the ramp over: its (moved) end
    scale = 2 if event.get("demand_scale") else 1
    assert run.rates[end] == pytest.approx([300 * scale, 70 if "demand" in event else 150 * scale], rel=1e-6)
