"""Fuzzed scenario files as an outsider writes them from the documentation: a valid file with a field (any
field, at any depth) set to a value of the wrong type, out of range, at a bound, with a unit or a percent sign,
deleted, or misspelt. ``opsloop sim`` either refuses it (exit 2, one line naming the file, no traceback) or runs
it and prints a verdict with strict JSON and no negative figure (Hypothesis, derandomized, bounded examples)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsloop.controllers.edge import sim_cli

VALID: dict[str, Any] = {
    "name": "fuzz", "interval_s": 5, "duration_s": 40, "dt_s": 1, "seed": 1, "noise": 0.02,
    "demand_noise": 0.05, "client_tau_s": 2, "overload_slowdown": 1, "health_detection_delay_s": 0,
    "controllers": ["ours", "fixed-step"],
    "origins": [{"name": "us", "capacity_rps": 200, "service_ms": 10, "healthy": True},
                {"name": "eu", "capacity_rps": 1000}],
    "edges": [{"name": "sjc", "base_rps": 300, "elasticity": 1.0, "latency_ms": {"us": 20, "eu": 150},
               "initial_weights": {"us": 1.0}},
              {"name": "ams", "base_rps": 100, "latency_ms": {"eu": 10}}],
    "events": [{"at": 10, "label": "surge", "demand_scale": 1.5, "ramp_s": 10},
               {"at": 15, "demand": {"ams": 50}, "capacity": {"us": 150}},
               {"at": 20, "health": {"us": False}, "latency": {"sjc": {"eu": 90}}},
               {"at": 25, "stale_for_s": 10, "demand_scale": {"sjc": 0.5}}],
    "controller": {"headroom": 0.05, "max_step": 0.5},
    "fixed_step": {"step": 0.02},
    "targets": {"tolerance": 0.05, "steady_intervals": 4, "overload_slack_s": 0},
}
ODD_VALUES = [-1, 0, 0.0, 0.5, 1, 2, 7, 40, 1e9, 1e308, float("inf"), float("nan"), True, False, None,
              "30s", "5%", "", " ", "x", "no", "café", [], {}, [1, 2], {"us": 1}, {"nope": 1}]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index of the document, containers too."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(_paths(value, prefix + (key,)))
    return out


PATHS = _paths(VALID)
MUTATION = st.tuples(st.sampled_from(PATHS), st.sampled_from(["set", "delete", "misspell"]),
                     st.sampled_from(ODD_VALUES))


def _mutate(doc: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> None:
    parent: Any = doc
    for key in path[:-1]:
        if isinstance(parent, dict) and key in parent or isinstance(parent, list) and key < len(parent):
            parent = parent[key]
        else:
            return   # an earlier mutation removed the way there
    key = path[-1]
    if isinstance(parent, dict) and key in parent or isinstance(parent, list) and key < len(parent):
        if how == "set":
            parent[key] = value
        elif how == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[f"{key}s"] = parent.pop(key)


def _no_negative(value: Any, where: str = "") -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert value >= 0, f"{where} = {value}"
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_negative(v, f"{where}.{k}")
    elif isinstance(value, list):
        for k, v in enumerate(value):
            _no_negative(v, f"{where}[{k}]")


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(MUTATION, min_size=0, max_size=3))
def test_a_mutated_scenario_is_refused_in_one_line_or_judged_in_strict_json(
        mutations: list[tuple[tuple[Any, ...], str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(VALID)
    for path, how, value in mutations:
        _mutate(doc, path, how, value)
    f = tmp_path / "scenario.yaml"
    f.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    code = sim_cli.main(["--scenario", str(f), "--json"])
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if not line.startswith(f"opsloop sim: warning: {f}: ")]
    if code == 2:
        assert len(errors) == 1 and errors[0].startswith(f"opsloop sim: {f}: "), out.err
        assert out.out == "", out.out[:500]
        return
    assert code in (0, 1) and not errors, out.err
    result = json.loads(out.out, parse_constant=lambda c: pytest.fail(f"--json holds {c}"))
    for kind, summary in result["controllers"].items():
        _no_negative(summary, kind)
        assert isinstance(summary["meets_targets"], bool)
    if "ours" in result["controllers"]:
        assert (code == 0) == result["controllers"]["ours"]["meets_targets"]
