"""The robustness suite: new variants of the eight scenario kinds (1-6 edges x 2-6 origins, other
latencies, noise seeds and periods, surge edges, flap periods, capacity ratios, 10-30 s control
intervals), each judged by the simulator's own verdict against both fixed-step baselines of the same run (simulated time only).

Misses are named here with their figures (and in controllers/edge/README.md); a named miss that
no longer occurs fails the test, so the list cannot go stale."""

from __future__ import annotations


import pytest

from opsloop.controllers.edge.sim import load_scenario, run_scenario
from tests.helpers import REPO

SUITE = REPO / "controllers" / "edge" / "scenarios" / "robustness"
NAMES = sorted(p.stem for p in SUITE.glob("*.yaml"))
KINDS = ("useu", "failure", "mesh", "shortfall", "surge", "noise", "flap", "capacity")

# scenario -> the violation kinds it still shows (prefix of the verdict's message), with figures
KNOWN_MISSES: dict[str, set[str]] = {
    # independent draws every interval: 95th-percentile plan (held to the 8 % latency budget);
    # overload 26 s = 24 % of 108 s
    "noise_closed_loop": {"overload-seconds"},
    # draws held 30 s (two intervals): the plan chases them; weights swing 13.2 points,
    # overload 114 s = 35 % / 54 % of 325 s / 210 s (latency 1.07x since the budget); two
    # intervals early on overloaded `a` while reading 0.985 of it: planned 3-6 % below it since
    # (hidden overload), overload 99 s, and the run's later draws landed on a plan that moved
    # more to the 50-60 ms origin: latency 1.12x / 1.10x
    "noise_two_edges": {"weights oscillate", "overload-seconds", "mean latency"},
    # draws held 45 s: the plan stays on the window's mean level, the headroom baseline follows
    # each held draw for its 2nd and 3rd interval: overload 24 s vs 84 s / 13 s
    "noise_held_three_intervals": {"overload-seconds"},
    # x2.5 at one edge 13 s into a 15 s interval: the first tick reads 3 % of it (within the
    # noise), the origin runs over capacity until the second tick sheds it: 15 s, 10.07 % of the
    # headroom baseline's 149 s (limit 10 %); no controller reading interval means does better
    "surge_late_in_interval": {"overload-seconds"},
    # the way home after the third surge is still under way when the fourth comes (settled
    # 116 s into the 120 s phase): the near origins' load 6.0 % of capacity peak to peak as the
    # relax steps bring e2 back (11 judged overload-s vs 417 s / 417 s)
    "surge_repeated": {"load oscillates"},
    # every edge x1.3 9 s into a 15 s interval: the first tick reads rises of 3-9 % (the clients'
    # 2 s lag leaves ~30 % of the step in the mean), under one edge's step bar (4 sd, 11 %) and
    # over their mean's; but the interval before read +2.4 % on average (noise), more than a
    # quarter of the last rise, as the second interval of a common ramp does: not taken for a
    # step (on 2 of the sweep's 5 seeds it is); 30 s over capacity vs 277 s / 73 s
    "mesh_step_mid_interval": {"overload-seconds"},
    # at the peak, relax steps of ~3 points of one edge's weights toward a target that moves
    # with the 2 % measurement noise swing a small origin (180 req/s) by 7.1 % of its capacity
    "mesh_three_by_five_ramp": {"load oscillates"},
    # nearly open-loop clients, 110 req/s beyond the US cap: moved 70-95 ms away within 2
    # intervals (no overload; the baselines 585 s over capacity): latency 1.22x / 1.18x
    "useu_low_elasticity": {"mean latency"},
}


def test_every_kind_has_several_variants():
    for kind in KINDS:
        assert len([n for n in NAMES if n.startswith(kind)]) >= 3, kind


@pytest.mark.parametrize("name", NAMES)
def test_variant_meets_the_targets_against_both_baselines(name):
    scn = load_scenario(SUITE / f"{name}.yaml")
    summaries, _ = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours = summaries["ours"]
    assert set(ours["baselines"]) == {"fixed-step", "fixed-step-headroom"}
    allowed = KNOWN_MISSES.get(name, set())
    unexpected = [v for v in ours["violations"] if not any(k in v for k in allowed)]
    assert not unexpected, unexpected
    for kind in allowed:
        assert any(kind in v for v in ours["violations"]), f"{name}: {kind!r} no longer missed"
    # the safety side holds everywhere, named misses or not
    assert ours["churn"] <= 0.05 and ours["excess_p95"] <= 0.10


@pytest.mark.parametrize("seed", [17, 47, 83])
def test_closed_loop_shortfall_relaxes_back_without_a_limit_cycle(seed):
    """After "demand back", relax steps move e2 back onto b while its closed-loop clients speed
    up. The step back (-0.47, then -0.12 as the clients settle) read as demand noise (σ ~5 %),
    the plan went on the noisy window's level, a mix of draws taken before those moves, and the
    worst-case prediction ran ~10 % low: b 1.00-1.04, shed, relax again (weights 6.7-10 points,
    load 15-34 % peak to peak)."""
    scn = load_scenario(SUITE / "shortfall_closed_loop.yaml").model_copy(update={"seed": seed})
    summaries, _ = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours = summaries["ours"]
    assert not [v for v in ours["violations"] if "demand back" in v or "overload" in v], \
        ours["violations"]
