"""A run with load on an origin of zero capacity: the metrics read it as 10^6 × capacity, and the verdict
printed "95th-percentile excess over capacity ... 99999900.0% > 5.0%". It says what it is instead."""

from __future__ import annotations

from pathlib import Path

from opsloop.controllers.edge.sim import run_scenario
from opsloop.controllers.edge.sim.scenario import load_scenario
from opsloop.controllers.edge.sim import verdict
from tests.helpers import run_cli

SCENARIO = """name: zero-capacity
interval_s: 10
duration_s: 120
origins: [{name: near, capacity_rps: 100}, {name: far, capacity_rps: 0}]
edges: [{name: e1, base_rps: 50, latency_ms: {near: 5, far: 1}, initial_weights: {near: 0.5, far: 0.5}}]
controllers: [fixed-step]
"""


def test_the_excess_on_a_zero_capacity_origin_is_said_in_words(tmp_path: Path) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_text(SCENARIO)
    summaries, _ = run_scenario(load_scenario(f))
    found = summaries["fixed-step"]["violations"]
    excess = [v for v in found if v.startswith("95th-percentile excess over capacity")]
    assert excess == ["95th-percentile excess over capacity outside step transients unbounded (load on an origin "
                      "with no capacity) > 5.0%"], found
    assert not any("99999" in v for v in found), found


def test_an_ordinary_excess_is_a_percentage() -> None:
    text = verdict.excess_text
    assert text(0.123) == "12.3%" and text(0.0) == "0.0%" and text(250.0) == "25000.0%"


def test_the_sim_summary_line_says_it_in_words_too(tmp_path: Path) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_text(SCENARIO)
    out = run_cli("sim", "--scenario", str(f))
    summary = [line for line in out.stdout.splitlines() if line.startswith("fixed-step") and "excess p95" in line]
    assert summary and "excess p95 unbounded (load on an origin with no capacity)" in summary[0], out.stdout
    assert "99999" not in out.stdout, out.stdout
