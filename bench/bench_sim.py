"""Edge control in closed loop: our controller vs the fixed-step baselines on the shipped scenarios.

Every scenario under controllers/edge/scenarios/ is simulated (``opsloop sim``'s plant) for our
controller and, on the same plant and noise, the fixed-step baseline (2 % per origin per interval)
as it was and with our 5 % headroom. Figures are simulated seconds and request-weighted latency,
not wall clock, so the run is deterministic. Rows per scenario: overload-seconds after the first
tick (target ≤ 10 % of each baseline's), mean latency outside shortfalls (target ≤ 1.10 × the
baseline's), the 95th-percentile excess over capacity outside step transients (≤ 5 %), churn
outside step transients (≤ 3 points per interval) and whether the scenario's own verdict passes.
``--quick`` runs the eight shipped scenario kinds only; the full run adds every variant of the
robustness suite (``scenarios/robustness``) and one row counting the variants that meet every
target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opsloop.controllers.edge.sim import load_scenario, run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "controllers" / "edge" / "scenarios"
ROBUSTNESS = SCENARIOS / "robustness"
EIGHT_KINDS = ("us_eu_experiment", "origin_failure", "mesh_peak", "shortfall", "surge_one_edge",
               "noise_near_capacity", "flapping_origin", "capacity_halved")


def _row(bench: str, metric: str, value: float, baseline: str, base: float, unit: str,
         target: str, ok: bool | None) -> dict[str, Any]:
    ratio = round(value / base, 4) if base else (0.0 if value == 0 else float("inf"))
    return {"benchmark": bench, "metric": metric, "value": round(value, 3), "baseline": baseline,
            "baseline_value": round(base, 3), "ratio": ratio if ratio != float("inf") else 999.0,
            "unit": unit, "target": target, "ok": ok}


def run(quick: bool = False) -> list[dict[str, Any]]:
    paths = [SCENARIOS / f"{n}.yaml" for n in EIGHT_KINDS] if quick else \
        sorted(SCENARIOS.glob("*.yaml")) + sorted(ROBUSTNESS.glob("*.yaml"))
    rows: list[dict[str, Any]] = []
    passed = {"ours": 0, "fixed-step": 0}
    for path in paths:
        name = path.stem if path.parent == SCENARIOS else f"robustness/{path.stem}"
        scn = load_scenario(path)
        summaries, _ = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
        ours = summaries["ours"]
        bench = f"edge sim {name}"
        slack = scn.targets.overload_slack_s
        for kind in ("fixed-step", "fixed-step-headroom"):
            base = summaries[kind]
            rows.append(_row(bench, f"overload-s after the first tick vs {kind}",
                             ours["judged_overload_s"], kind, base["judged_overload_s"], "s",
                             f"≤ 10 % of baseline{f' + {slack:g}s' if slack else ''}",
                             ours["judged_overload_s"] <= 0.10 * base["judged_overload_s"] + slack
                             + 1e-9))
            # the verdict's figures: the phases both runs spent outside a shortfall
            compared = ours["baselines"][kind]["mean_latency_compared_ms"]
            rows.append(_row(bench, f"mean latency (outside shortfalls) vs {kind}",
                             compared["ours"], kind, compared[kind], "ms", "ratio ≤ 1.10",
                             compared["ours"] <= 1.10 * compared[kind] + 1e-9))
        fixed = summaries["fixed-step"]
        rows.append(_row(bench, "p95 excess over capacity outside transients",
                         ours["excess_p95"], "fixed-step", fixed["excess_p95"], "fraction",
                         "≤ 0.05", ours["excess_p95"] <= 0.05 + 1e-9))
        rows.append(_row(bench, "churn outside transients (share per interval)", ours["churn"],
                         "fixed-step", fixed["churn"], "fraction", "≤ 0.03",
                         ours["churn"] <= 0.03 + 1e-9))
        rows.append(_row(bench, "failed requests (unhealthy origin)", ours["failed_requests"],
                         "fixed-step", fixed["failed_requests"], "requests", "report", None))
        rows.append(_row(bench, "scenario verdict (1 = meets targets)",
                         float(ours["meets_targets"]), "fixed-step",
                         float(fixed["meets_targets"]), "bool", "1", ours["meets_targets"]))
        if name.startswith("robustness/"):
            passed["ours"] += int(ours["meets_targets"])
            passed["fixed-step"] += int(fixed["meets_targets"])
    n_robust = sum(1 for p in paths if p.parent == ROBUSTNESS)
    if n_robust:
        rows.append(_row("edge sim robustness suite", f"variants meeting every target (of {n_robust})",
                         passed["ours"], "fixed-step", passed["fixed-step"], "scenarios",
                         f"{n_robust}", passed["ours"] == n_robust))
    return rows


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_sim", __doc__, run))
