"""Seed sweep of the edge controller: every shipped scenario and every robustness variant, run
again with other random seeds (the scenario's ``seed``: the measurement-noise stream and the true
demand-noise stream drawn from it), each judged by the simulator's own verdict against both
fixed-step baselines of the same run. Simulated time only, so the figures are deterministic.

Prints one line per scenario and seed with the verdict's violations, then the pass rate and every
failure that the robustness test's named misses (tests/controllers/edge/test_robustness.py,
KNOWN_MISSES) do not account for.

Examples:
  python -m bench.sim_sweep                      # seeds: the file's own + 4 others
  python -m bench.sim_sweep --seeds 1 2 3 --only shortfall noise
  python -m bench.sim_sweep --json > sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from opsloop.argtypes import integer
from opsloop.controllers.edge.sim import load_scenario, run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "controllers" / "edge" / "scenarios"
ROBUSTNESS = SCENARIOS / "robustness"
DEFAULT_SEEDS = (11, 29, 47, 83)  # beside each file's own seed


def scenario_paths(only: list[str] | None = None) -> list[tuple[str, Path]]:
    out = [(p.stem, p) for p in sorted(SCENARIOS.glob("*.yaml"))]
    out += [(f"robustness/{p.stem}", p) for p in sorted(ROBUSTNESS.glob("*.yaml"))]
    if only:
        out = [(n, p) for n, p in out if any(o in n for o in only)]
    return out


def run_one(name: str, path: Path, seed: int | None) -> dict[str, Any]:
    scn = load_scenario(path)
    if seed is not None:
        scn = scn.model_copy(update={"seed": seed})
    summaries, _ = run_scenario(scn, ["ours", "fixed-step", "fixed-step-headroom"])
    ours = summaries["ours"]
    return {"scenario": name, "seed": scn.seed, "own_seed": seed is None,
            "violations": ours["violations"], "churn": ours["churn"],
            "excess_p95": ours["excess_p95"], "overload_s": ours["judged_overload_s"],
            "baseline_overload_s": {k: v["overload_s"] for k, v in ours["baselines"].items()},
            "failed_requests": ours["failed_requests"]}


def sweep(seeds: list[int], only: list[str] | None = None, jobs: int = 1) -> list[dict[str, Any]]:
    tasks = [(n, p, s) for n, p in scenario_paths(only) for s in [None, *seeds]]
    if jobs <= 1:
        return [run_one(*t) for t in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(run_one, *zip(*tasks)))


def known_misses() -> dict[str, set[str]]:
    """The misses the tests name: robustness variants by their stem, shipped scenarios by name."""
    sys.path.insert(0, str(SCENARIOS.parents[2]))
    from tests.controllers.edge.test_robustness import KNOWN_MISSES
    from tests.controllers.edge.test_sim import NAMED
    return {**{f"robustness/{k}": v for k, v in KNOWN_MISSES.items()},
            **{k: set(v) for k, v in NAMED.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_sweep", description=__doc__.split("\n\n")[0],
                                 epilog="examples:" + __doc__.split("Examples:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=integer(0, 2 ** 32 - 1), nargs="+", default=list(DEFAULT_SEEDS),
                    help=f"seeds beside each file's own (default {' '.join(map(str, DEFAULT_SEEDS))})")
    ap.add_argument("--only", nargs="+", help="substrings of scenario names to run")
    ap.add_argument("--jobs", type=integer(1, 64), default=1, help="processes (default 1)")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    args = ap.parse_args(argv)
    results = sweep(args.seeds, args.only, args.jobs)
    known = known_misses()
    unexplained = []
    for r in results:
        allowed = known.get(r["scenario"], set())
        r["unexplained"] = [v for v in r["violations"] if not any(k in v for k in allowed)]
        if r["unexplained"]:
            unexplained.append(r)
    passed = sum(1 for r in results if not r["violations"])
    if args.json:
        print(json.dumps({"results": results, "passed": passed, "runs": len(results)}, indent=1))
    else:
        for r in results:
            tag = "ok  " if not r["violations"] else ("MISS" if not r["unexplained"] else "NEW ")
            print(f"{tag} {r['scenario']:<46} seed {r['seed']:>3}  overload {r['overload_s']:>5g} s "
                  f"(base {'/'.join(f'{v:g}' for v in r['baseline_overload_s'].values())})  "
                  f"churn {r['churn']:.1%}  p95 {r['excess_p95']:.1%}  "
                  + "; ".join(r["violations"]))
        print(f"\n{passed} of {len(results)} runs meet every target; "
              f"{len(unexplained)} fail beyond the named misses")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
