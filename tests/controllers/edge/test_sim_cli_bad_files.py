"""`opsloop sim --scenario FILE` with a scenario file it cannot use: exit 2 and one line naming the file
(and the line and column of a YAML error), never a traceback. Before: a file not UTF-8 was a
UnicodeDecodeError traceback and a YAML error PyYAML's multi-line message quoting the offending line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli, write_case_file

GOOD = """name: tiny
interval_s: 10
duration_s: 60
origins: [{name: near, capacity_rps: 100}]
edges: [{name: e1, base_rps: 50, latency_ms: {near: 5}}]
"""
CASES: dict[str, tuple[str | bytes | None, str]] = {
    "missing": (None, "cannot read (No such file or directory)"),
    "a directory": ("dir", "cannot read (Is a directory)"),
    "not UTF-8": (f"# r\xe9seau\n{GOOD}".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 3)"),
    "unclosed quote": ('name: "tiny\ninterval_s: 10\n',
                       "not valid YAML: line 3, column 1: found unexpected end of stream "
                       "(while scanning a quoted scalar from line 1, column 7)"),
    "empty": ("# nothing yet\n", "empty"),
    "not a mapping": ("- tiny\n", "expected a mapping at the top level, got list"),
    "a wrong field": (GOOD.replace("interval_s: 10", "interval_s: -10"), "interval_s: "),
    "nested too deeply": ("[" * 3000 + "]" * 3000, "nested too deeply"),
    # one row per step in the plant's arrays: numpy was asked for 447 GiB (a traceback)
    "too many steps": (GOOD + "dt_s: 1.0e-9\n", "dt_s: 1e-09 makes 6e+10 simulation steps over duration_s 60"),
    # the controllers never acted and the verdict still said "meets targets"
    "shorter than an interval": (GOOD.replace("duration_s: 60", "duration_s: 5"),
                                 "duration_s: 5.0 is shorter than one control interval (interval_s 10.0)"),
    # a check across fields quoted the whole document after "got"
    "a cross-field error": (GOOD + "events: [{at: 5, capacity: {near: .inf}}]\n",
                            "events[0] (at 5.0).capacity['near']: expected req/s in [0, 1e+09], got inf"),
    # YAML keeps the last of two equal keys: the first events list was dropped without a word
    "a key given twice": (GOOD + "events: [{at: 20, capacity: {near: 10}}]\n"
                                 "events: [{at: 40, capacity: {near: 100}}]\n",
                          "events: given twice (lines 6 and 7); YAML keeps only the last"),
    "a key given twice in an event": (GOOD + "events:\n  - {at: 20, health: {near: false}, health: {near: true}}\n",
                                      "events.0.health: given twice (lines 7 and 7)"),
    # pydantic read a boolean as a number: `capacity_rps: yes` ran at 1 req/s, `capacity: {near: off}` at 0
    "a boolean for a number": (GOOD.replace("capacity_rps: 100", "capacity_rps: yes"),
                               "origins.0.capacity_rps: expected a number, not a boolean"),
    "a boolean for an event's number": (GOOD + "events: [{at: 20, capacity: {near: off}}]\n",
                                        "events.0.capacity.near: expected a number, not a boolean"),
    "a boolean for a factor": (GOOD + "events: [{at: 20, demand_scale: {e1: on}}]\n",
                               "events.0.demand_scale: e1: expected a number, not a boolean"),
    # counted as a change: a phase of its own, judged on its own, in which nothing changed
    "an empty change": (GOOD + "events: [{at: 20, label: nothing, capacity: {}}]\n",
                        "events[0] (at 20.0).capacity: empty (name at least one origin)"),
    # the plant runs whole steps: 60.5 s ran 60 s
    "a duration between steps": (GOOD.replace("duration_s: 60", "duration_s: 60.5"),
                                 "duration_s: must be a multiple of dt_s (1.0), got 60.5"),
    # YAML 1.1 reads an unquoted no as false: "Input should be a valid string (got False)" alone
    "a name read as a boolean": (GOOD.replace("name: near", "name: no").replace("{near: 5}", "{no: 5}"),
                                 "quote such a name"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_scenario_file_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    content, expected = CASES[case]
    f = write_case_file(tmp_path / "scenario.yaml", content)
    r = run_cli("sim", "--scenario", str(f), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"opsloop sim: {f}: ") and expected in lines[0], lines[0]
    assert "base_rps" not in lines[0] or case == "a wrong field", lines[0]   # never the document quoted


def test_the_good_scenario_runs(tmp_path: Path) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_text(GOOD)
    r = run_cli("sim", "--scenario", str(f), "--controllers", "ours", timeout=120)
    assert r.returncode in (0, 1) and "scenario tiny: 1 edge(s)" in r.stdout, r.stderr[-2000:]


def test_the_plot_is_written_where_it_says(tmp_path: Path) -> None:
    # a path without .png was written as path + ".png" while the message named the path; a directory
    # then "succeeded" too
    f = tmp_path / "scenario.yaml"
    f.write_text(GOOD)
    plot = tmp_path / "plot-without-suffix"
    r = run_cli("sim", "--scenario", str(f), "--controllers", "ours", "--plot", str(plot), timeout=120)
    assert r.returncode in (0, 1) and f"plot written to {plot}" in r.stderr, r.stderr[-2000:]
    assert plot.read_bytes().startswith(b"\x89PNG") and not plot.with_suffix(".png").exists()
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    r = run_cli("sim", "--scenario", str(f), "--controllers", "ours", "--plot", str(a_dir), timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"opsloop sim: cannot write plot {a_dir}: Is a directory", r.stderr


def test_a_scenario_that_overflows_the_plant_is_refused_not_judged(tmp_path: Path) -> None:
    # demand_scale 1e308 was accepted: every metric came out NaN, the verdict said "meets targets" (exit 0)
    # and --json printed NaN, which is not JSON
    f = tmp_path / "scenario.yaml"
    f.write_text(GOOD + "events: [{at: 5, demand_scale: 1.0e+308}]\n")
    r = run_cli("sim", "--scenario", str(f), "--json", timeout=120)
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("opsloop sim:")]
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", r.stderr[-2000:]
    # refused by the simulator's check, or by the model once it bounds demand_scale
    assert "the simulation overflowed" in lines[0] or "demand_scale" in lines[0], lines[0]
