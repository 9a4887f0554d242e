"""Every number of a scenario file has a sane range: one above it (or NaN, or infinite) is one error
naming the field. `demand_scale: 1e308` turned every figure of the run into NaN, caught only after the
run by the check of its metrics; a negative seed was numpy's traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsloop.controllers.edge.sim import load_scenario
from opsloop.controllers.edge.sim.scenario import ScenarioError
from tests.helpers import REPO, run_cli

GOOD: dict[str, Any] = {
    "name": "tiny", "interval_s": 10, "duration_s": 600,
    "origins": [{"name": "near", "capacity_rps": 100}, {"name": "far", "capacity_rps": 100}],
    "edges": [{"name": "e1", "base_rps": 50, "latency_ms": {"near": 5, "far": float("inf")}}],
    "events": [{"at": 60, "demand_scale": 2.0, "ramp_s": 30}, {"at": 120, "stale_for_s": 20}],
}
INF, NAN = float("inf"), float("nan")
# (where, value, what the one line says): every numeric field of the format, above its range or not finite
CASES: list[tuple[tuple[Any, ...], Any, str]] = [
    (("interval_s",), 1e9, "interval_s: Input should be less than or equal to 3600"),
    (("interval_s",), INF, "interval_s: Input should be"),
    (("duration_s",), NAN, "duration_s: Input should be a finite number"),
    (("dt_s",), 1e6, "dt_s: Input should be less than or equal to 3600"),
    (("seed",), -1, "seed: Input should be greater than or equal to 0"),
    (("seed",), 2 ** 70, "seed: Input should be less than or equal to"),
    (("client_tau_s",), 1e300, "client_tau_s: Input should be less than or equal to 3600"),
    (("overload_slowdown",), 1e300, "overload_slowdown: Input should be less than or equal to 1000"),
    (("demand_noise_period_s",), INF, "demand_noise_period_s: Input should be a finite number"),
    (("health_detection_delay_s",), 1e12, "health_detection_delay_s: Input should be less than or equal to 86400"),
    (("origins", 0, "capacity_rps"), 1e300, "origins.0.capacity_rps: Input should be less than or equal to 1000000000"),
    (("origins", 0, "service_ms"), 1e300, "origins.0.service_ms: Input should be less than or equal to 60000"),
    (("edges", 0, "base_rps"), 1e300, "edges.0.base_rps: Input should be less than or equal to 1000000000"),
    (("edges", 0, "elasticity"), NAN, "edges.0.elasticity: Input should be a finite number"),
    (("edges", 0, "latency_ms", "near"), 1e300, "edges['e1'].latency_ms['near']: 1e+300 ms is above 60000 ms"),
    (("events", 0, "demand_scale"), 1e308, "events[0] (at 60.0).demand_scale: expected a factor in [0, 1000], got 1e+308"),
    (("events", 0, "demand_scale"), {"e1": 1e308}, "events[0] (at 60.0).demand_scale['e1']: expected a factor in [0, 1000]"),
    (("events", 0, "demand_scale"), NAN, "events[0] (at 60.0).demand_scale: expected a factor in [0, 1000], got nan"),
    (("events", 0, "demand"), {"e1": 1e300}, "events[0] (at 60.0).demand['e1']: expected req/s in [0, 1e+09]"),
    (("events", 0, "capacity"), {"near": 1e300}, "events[0] (at 60.0).capacity['near']: expected req/s in [0, 1e+09]"),
    (("events", 0, "latency"), {"e1": {"near": 1e300}}, "events[0] (at 60.0).latency['e1']['near']: 1e+300 ms is above"),
    (("events", 0, "ramp_s"), 1e300, "events.0.ramp_s: Input should be less than or equal to 86400"),
    (("events", 1, "stale_for_s"), 1e300, "events.1.stale_for_s: Input should be less than or equal to 86400"),
    (("events", 1, "at"), INF, "events.1.at: Input should be"),
    (("targets", "tolerance"), NAN, "targets.tolerance: Input should be a finite number"),
    (("targets", "latency_ratio"), 1e300, "targets.latency_ratio: Input should be less than or equal to 100"),
    (("targets", "overload_slack_s"), INF, "targets.overload_slack_s: Input should be"),
    (("targets", "steady_intervals"), 10 ** 12, "targets.steady_intervals: Input should be less than or equal to 10000"),
]


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    node: Any = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[path[-1]] = value
    return doc


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    f = tmp_path / "scenario.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_the_good_scenario_loads(tmp_path: Path) -> None:
    assert load_scenario(_write(tmp_path, GOOD)).events[0].demand_scale == 2.0


@pytest.mark.parametrize("path, value, expected", CASES, ids=[f"{'.'.join(map(str, c[0]))}={c[1]!r}"[:60] for c in CASES])
def test_a_number_out_of_range_is_one_line_naming_the_field(path: tuple[Any, ...], value: Any, expected: str,
                                                            tmp_path: Path) -> None:
    f = _write(tmp_path, _with(path, value))
    with pytest.raises(ScenarioError) as e:
        load_scenario(f)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{f}: ") and expected in line, line


def test_factors_that_compound_past_the_bound_are_refused(tmp_path: Path) -> None:
    # each factor is in range; 8 of them take 50 req/s to 1.3e26
    doc = copy.deepcopy(GOOD)
    doc["events"] = [{"at": 10 * (i + 1), "demand_scale": 1000} for i in range(8)]
    with pytest.raises(ScenarioError, match=r"events\[4\] \(at 50.0\).demand_scale: the demand of edge 'e1' grows "
                                            r"to 5e\+16 req/s \(at most 1e\+15\)"):
        load_scenario(_write(tmp_path, doc))
    doc["events"] = [{"at": 10, "demand_scale": 1000}, {"at": 20, "demand": {"e1": 50}},
                     {"at": 30, "demand_scale": 1000}]   # a demand set in between starts again
    assert len(load_scenario(_write(tmp_path, doc)).events) == 3


def test_opsloop_sim_refuses_demand_scale_1e308_before_running(tmp_path: Path) -> None:
    f = _write(tmp_path, _with(("events", 0, "demand_scale"), 1e308))
    r = run_cli("sim", "--scenario", str(f), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "events[0] (at 60.0).demand_scale: expected a factor in [0, 1000], got 1e+308" in lines[0]


def test_every_shipped_scenario_is_within_the_ranges() -> None:
    files = sorted((REPO / "controllers" / "edge" / "scenarios").rglob("*.yaml"))
    assert len(files) > 40
    for f in files:
        load_scenario(f)
