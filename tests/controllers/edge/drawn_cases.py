"""Draws of ``bench.sim_kinds`` kept as testdata (each file's first line says how it was drawn):
run one against both fixed-step baselines and hold it to the verdict's overload criterion."""

from __future__ import annotations

from pathlib import Path

from opsloop.controllers.edge.sim import load_scenario, run_scenario
from opsloop.controllers.edge.sim.plant import Run

TESTDATA = Path(__file__).parent / "testdata"


def run_meeting_targets(name: str) -> Run:
    """Run ``testdata/<name>.yaml``; assert ours is over capacity at most a tenth of the
    headroom baseline's judged overload-seconds and meets every target; ours' run."""
    scn = load_scenario(TESTDATA / f"{name}.yaml")
    summaries, runs = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours, base = summaries["ours"], summaries["fixed-step-headroom"]
    assert ours["judged_overload_s"] <= 0.1 * base["judged_overload_s"], (
        ours["judged_overload_s"], base["judged_overload_s"])
    assert ours["meets_targets"], ours["violations"]
    return runs["ours"]
