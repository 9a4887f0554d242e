"""The eight shipped scenario kinds under other random seeds (the scenario's ``seed``: its
measurement noise and its true demand noise), so that no kind passes because of one draw of the
noise: the safety side is asserted on every run, the control targets wherever they are met today,
and each miss is named here with its figures (a named miss that no longer occurs fails the test,
so the list cannot go stale). Simulated time only. ``python -m bench.sim_sweep`` runs the same
sweep over every scenario and robustness variant with more seeds."""

from __future__ import annotations

import numpy as np
import pytest

from opsloop.controllers.edge.sim import load_scenario, run_scenario
from tests.helpers import REPO

SCENARIOS = REPO / "controllers" / "edge" / "scenarios"
KINDS = ("us_eu_experiment", "origin_failure", "mesh_peak", "shortfall", "surge_one_edge",
         "noise_near_capacity", "flapping_origin", "capacity_halved")
SEEDS = (11, 29, 47)

# (scenario, seed) -> the violation kinds it shows (prefix or part of the verdict's message)
SEED_MISSES: dict[tuple[str, int], set[str]] = {
    # true demand noise sd 10 % redrawn every interval at ~95 % of the near origin: the plan
    # covers the 95th percentile of the draws; 36 s / 35 s over capacity (40 % / 33 % of the
    # headroom baseline's; 49 s before the plan left room for hidden overload)
    ("noise_near_capacity", 11): {"overload-seconds"},
    ("noise_near_capacity", 29): {"overload-seconds"},
    # seed 47: its σ estimate grows with a run of large draws and the plan follows the window's
    # level: p95 excess 7.3 %, churn 3.3 %, 80 s over capacity (50 % / 55 % of the baselines');
    # its weights swung 6.2 points at the start before the plan left room for hidden overload
    ("noise_near_capacity", 47): {"overload-seconds", "churn", "95th-percentile"},
    # x3 at one of three edges: 14 s over capacity against the headroom baseline's 123 s (11 %)
    ("surge_one_edge", 47): {"overload-seconds"},
}


def _seen_health(scn, run) -> np.ndarray:
    """[K, O]: the health the controller saw at each tick (health_detection_delay_s late)."""
    delay = int(round(scn.health_detection_delay_s / scn.dt_s))
    idx = np.round(run.tick_times / scn.dt_s).astype(int) - 1 - delay
    return run.healthy[np.clip(idx, 0, len(run.times) - 1)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", KINDS)
def test_kind_under_another_seed(name, seed):
    scn = load_scenario(SCENARIOS / f"{name}.yaml")
    scn = scn.model_copy(update={"seed": seed})
    summaries, runs = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours, run = summaries["ours"], runs["ours"]

    # the safety side, everywhere: shares valid, never all zero, nothing on an origin seen
    # unhealthy while a usable one exists, bounded steps (but for a forced move off an origin
    # whose health changed), churn and excess within twice their targets
    weights = run.tick_weights
    assert (weights >= -1e-12).all()
    np.testing.assert_allclose(weights.sum(axis=2), 1.0, atol=1e-9)
    seen = _seen_health(scn, run)
    reach = np.isfinite(np.array([[e.latency_ms.get(o.name, np.inf) for o in scn.origins]
                                  for e in scn.edges]))
    for k in range(len(run.tick_times)):
        now, before = weights[k + 1], weights[k]
        usable = reach & seen[k][None, :]
        if run.tick_modes[k] != "hold":
            for e in np.flatnonzero(usable.any(axis=1)):
                assert now[e][~usable[e]].sum() <= 1e-9, (k, e, now[e])
        if k > 0 and (seen[k] == seen[k - 1]).all():
            assert np.abs(now - before).max() <= scn.controller.max_step + 1e-9, k
    assert ours["churn"] <= 2 * scn.targets.churn and ours["excess_p95"] <= 2 * scn.targets.excess_p95

    # the targets where they are met today; the misses by name
    allowed = SEED_MISSES.get((name, seed), set())
    unexpected = [v for v in ours["violations"] if not any(k in v for k in allowed)]
    assert not unexpected, unexpected
    for kind in allowed:
        assert any(kind in v for v in ours["violations"]), f"{name} seed {seed}: {kind!r} now holds"
