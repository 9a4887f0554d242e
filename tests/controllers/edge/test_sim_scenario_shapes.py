"""Scenarios of the eight kinds in shapes the shipped ones do not take (1 edge × 1 origin, 6 origins, names with
dashes, dots and non-ASCII letters, events at t=0, in the last interval and out of order, capacity 0, an edge with
no demand, a ramp ending after the run, noise without a seed): each runs, keeps its names, and prints strict JSON.
And the verdict on them: a single origin under noisy demand (no weights can help) was judged on whether the
phase's last draw happened to be above its capacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsloop.controllers.edge.sim import Scenario, run_scenario
from tests.helpers import run_cli


def _doc(name: str, origins: dict[str, float], edges: dict[str, tuple[float, dict[str, float]]],
         events: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    return {"name": name, "duration_s": 300, **top,
            "origins": [{"name": o, "capacity_rps": c} for o, c in origins.items()],
            "edges": [{"name": e, "base_rps": rps, "latency_ms": lat} for e, (rps, lat) in edges.items()],
            "events": events or []}


SIX = {f"o{i}": 100 for i in range(1, 7)}
SHAPES: dict[str, dict[str, Any]] = {
    "useu one edge one origin, step at t=0": _doc(
        "useu-1x1", {"us": 200}, {"sjc": (150, {"us": 20})}, [{"at": 0, "demand": {"sjc": 180}}]),
    "useu names with dashes, dots, unicode": _doc(
        "us/eu – Zürich", {"us-east.1": 200, "eu.zürich": 1000}, {"sjc-01.edge": (300, {"us-east.1": 20,
                                                                                    "eu.zürich": 150})},
        interval_s=10, noise=0.02),
    "failure at t=0 of one of six origins, back in the last interval, out of order": _doc(
        "failure_six", SIX, {"e1": (250, {o: 5 * i for i, o in enumerate(SIX, 1)}),
                             "e2": (150, {o: 35 - 5 * i for i, o in enumerate(SIX, 1)})},
        [{"at": 285, "health": {"o1": True}}, {"at": 0, "health": {"o1": False}}]),
    "mesh 3x4 at peak, integers, events out of order": _doc(
        "mesh", {"a": 400, "b": 400, "c": 400, "d": 400},
        {"x": (300, {"a": 5, "b": 10, "c": 30, "d": 60}), "y": (300, {"a": 20, "b": 5, "c": 10, "d": 40}),
         "z": (300, {"a": 60, "b": 30, "c": 5, "d": 10})},
        [{"at": 180, "demand_scale": 0.69, "ramp_s": 60}, {"at": 30, "demand_scale": 1.45, "ramp_s": 60}]),
    "shortfall with an origin of capacity 0": _doc(
        "shortfall_cap0", {"a": 0, "b": 200}, {"e": (260, {"a": 5, "b": 20})}),
    "capacity of the only origin to 0": _doc(
        "all_zero", {"a": 100}, {"e": (50, {"a": 5})}, [{"at": 60, "capacity": {"a": 0}}]),
    "surge x3 at an edge with no demand and at a busy one": _doc(
        "surge_zero_edge", {"a": 400, "b": 400, "c": 900},
        {"idle": (0, {"a": 8, "b": 12, "c": 90}), "busy": (200, {"a": 10, "b": 9, "c": 85})},
        [{"at": 90, "demand_scale": {"idle": 3}}, {"at": 90, "demand_scale": {"busy": 3}}]),
    "surge ramp ending after the run": _doc(
        "ramp_past_end", {"a": 400, "b": 900}, {"e1": (150, {"a": 8, "b": 90}), "e2": (100, {"a": 9, "b": 80})},
        [{"at": 240, "demand_scale": {"e1": 3}, "ramp_s": 600}]),
    "noise near capacity without a seed": _doc(
        "noise_noseed", {"near": 300, "far": 1000}, {"e": (280, {"near": 10, "far": 40})}, demand_noise=0.2),
    "flapping every interval, down again in the last one": _doc(
        "flap", {"a.1": 300, "b-2": 600}, {"e": (200, {"a.1": 8, "b-2": 30})},
        [{"at": float(t), "health": {"a.1": k % 2 == 1}} for k, t in enumerate(range(100, 160, 10))]
        + [{"at": 290, "health": {"a.1": False}}], interval_s=10),
    "capacity halved, one origin, floats, half-second steps": _doc(
        "halved", {"a": 400.0}, {"e": (300.0, {"a": 8.0})}, [{"at": 150.0, "capacity": {"a": 200.0}}],
        interval_s=15.0, dt_s=0.5),
    "every path cut, every origin down and back": _doc(
        "cut", {"us": 200, "eu": 1000}, {"e": (150, {"us": 20, "eu": 150})},
        [{"at": 100, "latency": {"e": {"us": float("inf"), "eu": float("inf")}}},
         {"at": 150, "health": {"us": False, "eu": False}}, {"at": 200, "health": {"us": True, "eu": True}}]),
}


def _strict(text: str) -> Any:
    def refuse(value: str) -> None:
        raise AssertionError(f"{value} in the JSON output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_scenario_of_an_unusual_shape_runs_and_keeps_its_names(shape: str) -> None:
    doc = SHAPES[shape]
    scn = Scenario.model_validate(doc)
    summaries, _ = run_scenario(scn, ["ours"])
    ours = summaries["ours"]
    assert isinstance(ours["meets_targets"], bool)
    _strict(json.dumps(summaries))
    assert list(ours["overload_s"]) == [o["name"] for o in doc["origins"]]
    # a phase per plant-changing time, in time order, whatever the order in the file
    starts = [ph["start_s"] for ph in ours["phases"]]
    assert starts == sorted(starts) and starts[0] == 0
    assert set(starts) == {0.0} | {float(ev["at"]) for ev in doc["events"]}


def test_names_with_dashes_dots_and_unicode_survive_the_cli(tmp_path: Path) -> None:
    f = tmp_path / "zürich.yaml"
    f.write_text(yaml.safe_dump(SHAPES["useu names with dashes, dots, unicode"], allow_unicode=True),
                 encoding="utf-8")
    r = run_cli("sim", "--scenario", str(f), "--json", timeout=300)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr[-2000:]
    doc = _strict(r.stdout)
    assert doc["scenario"] == "us/eu – Zürich"
    assert set(doc["controllers"]["ours"]["trajectories"]["weights"]["sjc-01.edge"]) == {"us-east.1", "eu.zürich"}


def test_what_has_no_effect_is_said_to_have_none(tmp_path: Path) -> None:
    # at duration_s the run is over: the event was dropped without a word (no phase, no effect); a noise period
    # without demand_noise paced nothing
    f = tmp_path / "late.yaml"
    f.write_text(yaml.safe_dump(_doc("late", {"a": 300, "b": 300}, {"e": (200, {"a": 5, "b": 20})},
                                     [{"at": 300, "health": {"a": False}}], demand_noise_period_s=30)))
    r = run_cli("sim", "--scenario", str(f), "--controllers", "ours", "--json", timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"opsloop sim: warning: {f}: events[0] (at 300): at the end of the run (duration_s 300): never takes effect",
        f"opsloop sim: warning: {f}: demand_noise_period_s: has no effect without demand_noise > 0"], r.stderr
    assert _strict(r.stdout)["scenario"] == "late"   # stdout stays the document


@pytest.mark.parametrize("seed", range(4))
def test_noisy_demand_on_a_single_origin_is_judged_alike_whatever_the_last_draw(seed: int) -> None:
    # One origin: no weights can keep a demand draw above its capacity off it. Before, the phase counted as a
    # shortfall (judged against the common overload factor) only when its last sample was above capacity:
    # seeds 0, 1, 3 "missed" the targets on a 9-19 % excess p95, seed 2 "met" them, same plant, same controller.
    doc = _doc("noise_one_origin", {"only": 300}, {"e": (285, {"only": 10})}, demand_noise=0.2, seed=seed)
    summaries, _ = run_scenario(Scenario.model_validate(doc), ["ours"])
    ours = summaries["ours"]
    assert ours["excess_p95"] == 0.0 and ours["meets_targets"], ours["violations"]
    assert ours["overload_s"]["only"] > 0   # the overload itself is still counted
