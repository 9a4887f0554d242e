"""opsloop sim: run a closed-loop edge-weight scenario for our controller and the
fixed-step baseline.

Prints a table per controller (time to capacity, overshoot, settle time, oscillation,
overload-seconds per origin), or the full result with weight trajectories as JSON; ``--plot [PNG]``
writes a PNG of origin load and weights over time and says where. Exit status: 0 when every controller marked
``ours`` meets the targets, 1 when it does not, 2 for a bad scenario or arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from opsloop.controllers.edge.sim import (CONTROLLER_KINDS, Run, Scenario, ScenarioError, canonical_kind,
                                  load_scenario, run_scenario, trajectories)
from opsloop.controllers.edge.sim.scenario import scenario_warnings
from opsloop.controllers.edge.sim.verdict import excess_text

EPILOG = """examples:
  opsloop sim --scenario controllers/edge/scenarios/capacity_drop.yaml
  opsloop sim --scenario controllers/edge/scenarios/origin_failure.yaml --json > result.json
  opsloop sim --scenario controllers/edge/scenarios/demand_surge.yaml --plot surge.png
  opsloop sim --scenario controllers/edge/scenarios/demand_surge.yaml --plot     # ./demand_surge.png
  opsloop sim --scenario my.yaml --controllers ours,fixed-step,fixed-step-headroom,undamped

scenario format: controllers/edge/README.md
"""


def _fmt(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if value is None:
        return "never"
    return f"{value * scale:.{digits}f}{unit}"


def _pct(fraction: float | None) -> str:
    """A fraction (of capacity, of the traffic, of a weight) as a percentage: the table's one format for them."""
    return _fmt(fraction, "%", 100, 1)


def first_non_finite(value: Any, where: str = "") -> str | None:
    """The path of the first NaN or infinite number in a result (None when every number is finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(result)"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def render_table(scn: Scenario, summaries: dict[str, dict[str, Any]]) -> str:
    lines = [f"scenario {scn.name}: {len(scn.edges)} edge(s) × {len(scn.origins)} origin(s), "
             f"interval {scn.interval_s:g}s, {scn.duration_s:g}s simulated",
             f"targets: within capacity+{scn.targets.tolerance:.0%} in "
             f"{scn.targets.capacity_within_intervals:g} intervals "
             f"({scn.targets.capacity_within_intervals * scn.interval_s:g}s), overshoot ≤ "
             f"{scn.targets.overshoot:.0%}, weight oscillation ≤ {scn.targets.oscillation_weight:.0%}",
             ""]
    header = (f"{'controller':<10} {'phase':<36} {'to capacity':>11} {'overshoot':>9} "
              f"{'settle':>7} {'osc w':>6} {'osc load':>8}  overload per origin")
    lines.append(header)
    lines.append("-" * len(header))
    for kind, summ in summaries.items():
        kind = canonical_kind(kind)  # a scenario may still list a baseline by its old name
        for ph in summ["phases"]:
            m = ph["metrics"]
            overload = " ".join(f"{o}={s:g}s" for o, s in m["overload_s"].items())
            label = f"{ph['label']} @{ph['start_s']:g}s"
            if not m["feasible"]:
                label += " (short)"
            lines.append(f"{kind:<10} {label[:36]:<36} {_fmt(m['time_to_capacity_s'], 's'):>11} "
                         f"{_pct(m['overshoot']):>9} {_fmt(m['settle_s'], 's'):>7} "
                         f"{_pct(m['oscillation_weight']):>6} {_pct(m['oscillation_load']):>8}  {overload}")
    lines.append("")
    for kind, summ in summaries.items():
        kind = canonical_kind(kind)
        verdict = "meets targets" if summ["meets_targets"] else "MISSES targets"
        lines.append(f"{kind:<10} {verdict}; mean latency {summ['mean_latency_ms']:.1f} ms, "
                     f"{summ['requests']:.0f} requests, {summ['failed_requests']:.0f} failed, "
                     f"overload {sum(summ['overload_s'].values()):g}s, excess p95 "
                     f"{excess_text(summ['excess_p95'])}, churn {_pct(summ['churn'])}/interval")
        for base, b in summ.get("baselines", {}).items():
            lines.append(f"{'':<10}   vs {base}: overload (judged) {b['overload_s']:g}s vs ours "
                         f"{summ['judged_overload_s']:g}s, mean latency "
                         f"{b['mean_latency_ms']:.1f} ms, {b['failed_requests']:.0f} failed")
        for violation in summ["violations"]:
            lines.append(f"{'':<10}   - {violation}")
    return "\n".join(lines)


def write_plot(scn: Scenario, runs: dict[str, Run], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 7), sharex=True, squeeze=False)
    for col, (kind, run) in enumerate(runs.items()):
        top, bottom = axes[0][col], axes[1][col]
        for j, origin in enumerate(scn.origins):
            cap = run.capacity[:, j]
            top.plot(run.times, 100 * run.loads[:, j] / (cap + (cap == 0)), label=origin.name)
        top.axhline(100, color="red", linestyle="--", linewidth=0.8)
        top.axhline(100 * (1 + scn.targets.tolerance), color="red", linestyle=":", linewidth=0.8)
        top.set_title(f"{kind}: origin load (% of capacity)")
        top.legend(fontsize="small")
        ticks = [0.0] + run.tick_times.tolist()
        for i, edge in enumerate(scn.edges):
            for j, origin in enumerate(scn.origins):
                shares = run.tick_weights[:, i, j]
                if shares.max() > 0:
                    bottom.step(ticks, 100 * shares, where="post", label=f"{edge.name}→{origin.name}")
        bottom.set_title(f"{kind}: weights (%)")
        bottom.set_xlabel("simulated time (s)")
        bottom.legend(fontsize="small")
        for ev in scn.events:
            for ax in (top, bottom):
                ax.axvline(ev.at, color="grey", linewidth=0.6)
    fig.suptitle(f"scenario {scn.name}")
    fig.tight_layout()
    # the format named: a path without .png (or a directory) was written as path + ".png" while
    # "plot written to <path>" was printed
    fig.savefig(path, dpi=90, format="png")
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opsloop sim", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML file")
    parser.add_argument("--json", action="store_true",
                        help="print metrics and weight trajectories as JSON")
    parser.add_argument("--plot", metavar="PNG", nargs="?", const="",
                        help="write a plot of load and weights to PNG (default: ./<scenario file name>.png); "
                             "the path written is printed on stderr")
    parser.add_argument("--controllers", metavar="LIST",
                        help=f"comma-separated, from {', '.join(CONTROLLER_KINDS)} "
                             "(default: the scenario's list)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scn = load_scenario(args.scenario)
        for warning in scenario_warnings(scn):   # stderr: --json keeps stdout to the document
            print(f"opsloop sim: warning: {args.scenario}: {warning}", file=sys.stderr)
        kinds = None
        if args.controllers:
            kinds = [k.strip() for k in args.controllers.split(",") if k.strip()]
            unknown = [k for k in kinds if canonical_kind(k) not in CONTROLLER_KINDS]
            if unknown or not kinds:
                raise ScenarioError(f"--controllers: unknown controller(s) {unknown!r} "
                                    f"(known: {', '.join(CONTROLLER_KINDS)})")
        summaries, runs = run_scenario(scn, kinds)
        # A value the model accepts but the plant's arithmetic overflows (demand_scale 1e308): the metrics
        # came out NaN, the verdict said "meets targets" and --json printed NaN (not JSON).
        bad = first_non_finite(summaries)
        if bad is not None:
            raise ScenarioError(f"{args.scenario}: the simulation overflowed ({bad} is not a finite number): "
                                "a rate, capacity or scale in the scenario is too large")
    except ScenarioError as exc:
        print(f"opsloop sim: {exc}", file=sys.stderr)
        return 2
    if args.plot is not None:
        plot = Path(args.plot or f"{Path(args.scenario).stem}.png").resolve()
        try:
            write_plot(scn, runs, str(plot))
        except OSError as exc:
            print(f"opsloop sim: cannot write plot {plot}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"plot written to {plot}", file=sys.stderr)  # stderr: --json keeps stdout to the document
    if args.json:
        doc = {"scenario": scn.name, "interval_s": scn.interval_s,
               "controllers": {kind: {**summaries[kind], "trajectories": trajectories(scn, runs[kind])}
                               for kind in summaries}}
        print(json.dumps(doc))
    else:
        print(render_table(scn, summaries))
    ours = summaries.get("ours")
    return 0 if ours is None or ours["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
