"""`opsloop sim` taken at its documented word: scenarios at the bounds of the format get a verdict whose
targets can be met, and the files an outsider would get wrong are refused with the field and the file.

- an edge that reaches only a small origin makes a shortfall the listener's total capacity hides: it was judged
  against capacity and "missed" by every controller alike (no weights can do better);
- the excess before the first tick of a phase too short for a transient (an event at 30 s) counted in the run's
  excess quantile (34.5 % on a run whose demand fell to 0 at 30 s), and the first move off the scenario's
  starting weights counted as churn;
- a run of one interval (its only decision at the end, never in force) was judged; an initial weight on an origin
  the edge has no path to failed every request from t=0; names that print alike could not be told apart."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from opsloop.controllers.edge.sim import Scenario, run_scenario, simulate, summarize
from opsloop.controllers.edge.sim.scenario import Event, SimEdge, SimOrigin, Targets
from opsloop.records import Mode
from tests.helpers import run_cli

BASE: dict[str, Any] = {
    "name": "bounds", "interval_s": 15, "duration_s": 300,
    "origins": [{"name": "us", "capacity_rps": 200}, {"name": "eu", "capacity_rps": 1000}],
    "edges": [{"name": "sjc", "base_rps": 300, "latency_ms": {"us": 20, "eu": 150}}]}


def _doc(**top: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc.update(top)
    return doc


class FixedPlan:
    """A controller that pushes ``plan`` at every tick: the verdict's figures without a control law in them."""

    def __init__(self, plan: np.ndarray) -> None:
        self.plan = plan

    def step(self, obs: Any) -> SimpleNamespace:
        return SimpleNamespace(weights=self.plan.copy(), mode=Mode.NORMAL, reason="fixed plan")


def _summary(doc: dict[str, Any], plan: list[list[float]]) -> dict[str, Any]:
    scn = Scenario.model_validate(doc)
    run = simulate(scn, "plan", build=lambda s, initial: FixedPlan(np.array(plan, dtype=float)))
    return summarize(scn, run)


CONFINED = _doc(edges=[{"name": "only_us", "base_rps": 300, "elasticity": 0, "latency_ms": {"us": 20}},
                       {"name": "both", "base_rps": 100, "elasticity": 0, "latency_ms": {"us": 20, "eu": 150},
                        "initial_weights": {"eu": 1}}])


def test_an_edge_confined_to_a_small_origin_is_judged_against_what_is_achievable() -> None:
    # 300 req/s that can only reach us (200) while the listener has 1200: the best plan (everything else on eu)
    # leaves us at 1.5x. Judged against capacity, it "never" came within it and missed for every controller.
    best = _summary(CONFINED, [[1.0, 0.0], [0.0, 1.0]])
    assert best["phases"][0]["metrics"]["feasible"] is False   # printed "(short)"
    assert best["time_to_capacity_s"] == 0.0 and best["excess_p95"] == 0.0, best["violations"]
    assert best["meets_targets"], best["violations"]
    assert best["overload_s"]["us"] == 300.0   # the overload itself is still counted
    # a plan that adds the other edge's traffic to us is still judged: us beyond the achievable 1.5x
    worse = _summary(CONFINED, [[1.0, 0.0], [1.0, 0.0]])
    assert worse["time_to_capacity_s"] is None and worse["excess_p95"] > 0.3, worse
    summaries, _ = run_scenario(Scenario.model_validate(CONFINED), ["ours"])
    assert not any("not within" in v or "excess" in v for v in summaries["ours"]["violations"]), summaries


def test_a_path_cut_by_an_event_confines_the_edge_from_then_on() -> None:
    # both edges reach both origins until the event cuts `a`'s path to eu: from then on, a shortfall on us
    doc = _doc(duration_s=600, edges=[
        {"name": "a", "base_rps": 300, "elasticity": 0, "latency_ms": {"us": 20, "eu": 150}},
        {"name": "b", "base_rps": 100, "elasticity": 0, "latency_ms": {"us": 20, "eu": 150}}],
        events=[{"at": 300, "label": "cut", "latency": {"a": {"eu": float("inf")}}}])
    s = _summary(doc, [[1.0, 0.0], [0.0, 1.0]])
    feasible = [ph["metrics"]["feasible"] for ph in s["phases"]]
    assert feasible == [True, False], s["phases"]
    # before the cut the same plan is a plain overload of us (eu had room): judged and missed there
    assert s["phases"][0]["metrics"]["time_to_capacity_s"] is None
    assert s["phases"][1]["metrics"]["time_to_capacity_s"] == 0.0


def test_the_excess_before_the_first_tick_is_not_judged() -> None:
    # everything starts on us (1.5x), the plan at the first tick (15 s) fits; at 30 s demand falls to 0. Only
    # the dead time before the first tick had an excess: every controller alike.
    doc = _doc(events=[{"at": 30, "demand_scale": 0}])
    s = _summary(doc, [[0.6, 0.4]])
    assert s["excess_p95"] == 0.0, s["violations"]
    assert not any("excess" in v for v in s["violations"]), s["violations"]


def test_the_first_move_off_the_starting_weights_is_not_churn() -> None:
    # two intervals: the plan's move at 150 s answers the starting weights; nothing moves after it
    s = _summary(_doc(interval_s=150), [[0.6, 0.4]])
    assert s["churn"] == 0.0 and s["meets_targets"], s["violations"]


COMPOSED, DECOMPOSED = "caf\u00e9", "cafe\u0301"   # "café" twice, as printed
REFUSED = {
    "one interval": (_doc(interval_s=300), "duration_s: 300.0 is under two control intervals (interval_s 300.0)"),
    "initial weight without a path": (
        _doc(edges=[{"name": "sjc", "base_rps": 300, "latency_ms": {"us": 20}, "initial_weights": {"eu": 1}}]),
        "edges['sjc'].initial_weights['eu']: no path to that origin"),
    "names composed and decomposed": (
        _doc(origins=[{"name": COMPOSED, "capacity_rps": 200}, {"name": DECOMPOSED, "capacity_rps": 1000}],
             edges=[{"name": "sjc", "base_rps": 300, "latency_ms": {COMPOSED: 20, DECOMPOSED: 150}}]),
        f"origins: names {COMPOSED!r} and {DECOMPOSED!r} print alike"),
    "names apart by a space": (
        _doc(origins=[{"name": "us", "capacity_rps": 200}, {"name": "us ", "capacity_rps": 1000}],
             edges=[{"name": "sjc", "base_rps": 300, "latency_ms": {"us": 20, "us ": 150}}]),
        "origins: names 'us' and 'us ' print alike"),
    "a blank name": (_doc(edges=[{"name": " ", "base_rps": 300, "latency_ms": {"us": 20}}]),
                     "edges: name ' ' is blank or holds a control character"),
    "a name with a newline": (_doc(edges=[{"name": "s\njc", "base_rps": 300, "latency_ms": {"us": 20}}]),
                              "edges: name 's\\njc' is blank or holds a control character"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_scenario_the_format_refuses_is_one_line_naming_the_field(case: str, tmp_path: Path) -> None:
    doc, expected = REFUSED[case]
    f = tmp_path / "scenario.yaml"
    f.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    r = run_cli("sim", "--scenario", str(f), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    # the field first: no "(top level): " before a check across fields
    assert lines[0] == f"opsloop sim: {f}: {expected}" or lines[0].startswith(f"opsloop sim: {f}: {expected}"), \
        lines[0]


def test_an_ignored_controller_interval_is_said(tmp_path: Path) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_text(yaml.safe_dump(_doc(duration_s=60, controller={"interval_s": 30})))
    r = run_cli("sim", "--scenario", str(f), "--controllers", "ours", "--json", timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert r.stderr.splitlines() == [f"opsloop sim: warning: {f}: controller.interval_s: ignored (30): every "
                                     "controller runs at the scenario's interval_s (15)"], r.stderr
    assert json.loads(r.stdout)["interval_s"] == 15


def test_every_field_of_the_format_is_in_the_readme_table() -> None:
    readme = (Path(__file__).parents[3] / "controllers" / "edge" / "README.md").read_text()
    section = readme.split("### Scenario file format (YAML)")[1].split("Metric definitions")[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    for model in (Scenario, SimOrigin, SimEdge, Event, Targets):
        for name in model.model_fields:
            assert f"`{name}`" in table or f"{name}`" in table or f", `{name}`" in table \
                or f"{name}," in table or f".{name}" in table, f"{model.__name__}.{name} not in the table"
