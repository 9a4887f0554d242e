"""Draws of ``bench.sim_kinds`` kept as testdata (each file's first line says how it was drawn):
run one against both fixed-step baselines and hold it to the verdict's overload criterion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opsloop.controllers.edge.sim import load_scenario, run_scenario
from opsloop.controllers.edge.sim.plant import Run

TESTDATA = Path(__file__).parent / "testdata"


def run_drawn(name: str, **controller: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Run]]:
    """Run ``testdata/<name>.yaml`` for ours and both fixed-step baselines, our controller's
    settings overridden by ``controller``; the summaries and runs by controller."""
    scn = load_scenario(TESTDATA / f"{name}.yaml")
    if controller:
        scn = scn.model_copy(update={"controller": scn.controller.model_copy(update=controller)})
    return run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])


def run_meeting_targets(name: str) -> Run:
    """Run ``testdata/<name>.yaml``; assert ours is over capacity at most a tenth of the
    headroom baseline's judged overload-seconds and meets every target; ours' run."""
    summaries, runs = run_drawn(name)
    ours, base = summaries["ours"], summaries["fixed-step-headroom"]
    assert ours["judged_overload_s"] <= 0.1 * base["judged_overload_s"], (
        ours["judged_overload_s"], base["judged_overload_s"])
    assert ours["meets_targets"], ours["violations"]
    return runs["ours"]
