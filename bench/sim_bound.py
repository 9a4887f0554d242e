"""How much of the noise kind can any controller pass? A bound, beside ours, on ``bench.sim_kinds``'s noise
scenarios (demand noise near an origin's capacity, judged against the fixed-step baselines).

The reference policy is an oracle that no controller can be: it knows each edge's true mean demand
(``base_rps``) from the start and holds one assignment for the whole run, the LP target with headroom
``h`` (no draw chased, nothing moved after a draw). It keeps the initial weights for the first ``W``
intervals (the warm-up every real controller needs to read the demand and its variability), then applies
the static assignment. For each scenario and warm-up it reports whether **some** ``h`` of the grid meets
every target of the verdict (the best any static policy does, ``h`` picked with hindsight), and whether
the **rule** "the largest ``h`` whose mean latency stays within ``--latency-budget`` of the baselines'"
does (``h`` picked by the one criterion that conflicts with overload). A last column does the same
without the oracle's knowledge: the mean of its own first ``W + 1`` readings, then held. Only the
noise kind: the other kinds change the plant during the run, which a static assignment cannot follow.

Examples:
  python -m bench.sim_bound                                  # 8 noise scenarios, seed 41
  python -m bench.sim_bound --per-kind 8 --seeds 41,42,43,11,71,51,52,61 --jobs 2
  python -m bench.sim_bound --warmups 0,1,2 --latency-budget 1.09
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from bench.sim_kinds import generate
from opsloop.argtypes import integer
from opsloop.controllers.edge.base import Controller, Observation, Proposal
from opsloop.controllers.edge.scheduler import Solution, solve
from opsloop.controllers.edge.sim import Scenario
from opsloop.controllers.edge.sim.plant import simulate
from opsloop.controllers.edge.sim.scenario import BASELINES
from opsloop.controllers.edge.sim.verdict import compare_with_baselines, run_scenario, summarize

HEADROOMS = np.round(np.arange(0.0, 0.305, 0.01), 2)   # the grid of h


class StaticOracle(Controller):
    """The LP target on the true mean demand with headroom ``headroom``, held from interval ``warmup`` on."""

    name = "static-oracle"

    def __init__(self, scn: Scenario, initial: np.ndarray, headroom: float, warmup: int) -> None:
        super().__init__(*initial.shape, stale_after_s=float(scn.interval_s) * 1000, max_step=1.0,
                         initial=initial)
        self.mean_demand = np.array([e.base_rps for e in scn.edges], dtype=float)
        self.headroom, self.warmup, self.ticks = headroom, warmup, 0
        self._held: Solution | None = None

    def _propose(self, obs: Observation) -> Proposal:
        self.ticks += 1
        if self._held is None:
            self._held = solve(self.mean_demand, obs.capacity, obs.latency, obs.healthy, headroom=self.headroom)
        if self.ticks <= self.warmup and self.weights is not None:
            return Proposal.of(self.weights, self._held, self.mean_demand, "warm-up: initial weights")
        return Proposal.of(self._held.weights, self._held, self.mean_demand, f"static, headroom {self.headroom}")


class LearnedStatic(StaticOracle):
    """The same, on the mean of its own readings instead of the true mean: those of the ``warmup`` intervals kept
    at the initial weights and the one read at the tick it applies the assignment (``warmup + 1`` in all)."""

    name = "learned-static"

    def __init__(self, scn: Scenario, initial: np.ndarray, headroom: float, warmup: int) -> None:
        super().__init__(scn, initial, headroom, warmup)
        self._readings: list[np.ndarray] = []

    def _propose(self, obs: Observation) -> Proposal:
        self.ticks += 1
        self._readings.append(np.asarray(obs.demand, dtype=float))
        if self.ticks <= self.warmup and self.weights is not None:
            reading = self._readings[-1]
            here = solve(reading, obs.capacity, obs.latency, obs.healthy, headroom=self.headroom)
            return Proposal.of(self.weights, here, reading, "warm-up: initial weights")
        if self._held is None:
            self.mean_demand = np.mean(self._readings, axis=0)
            self._held = solve(self.mean_demand, obs.capacity, obs.latency, obs.healthy, headroom=self.headroom)
        return Proposal.of(self._held.weights, self._held, self.mean_demand, f"static, headroom {self.headroom}")


def _verdicts(scn: Scenario, baselines: dict[str, dict[str, Any]], policy: type[StaticOracle], warmup: int,
              budget: float) -> tuple[bool, bool]:
    """(some h meets every target, the largest h within the latency budget does) for one policy."""
    rows = []
    for h in HEADROOMS:
        run = simulate(scn, policy.name, lambda s, w, h=float(h): policy(s, w, h, warmup))
        summary = summarize(scn, run)
        compare_with_baselines(scn, summary, baselines)
        ratio = max(v["mean_latency_compared_ms"]["ours"] / max(v["mean_latency_compared_ms"][k], 1e-9)
                    for k, v in summary["baselines"].items())
        rows.append((ratio, summary["meets_targets"]))
    within = [meets for ratio, meets in rows if ratio <= budget]
    return any(meets for _, meets in rows), bool(within) and within[-1]


def bound_one(scn: Scenario, warmups: list[int], budget: float) -> dict[str, Any]:
    """Ours as shipped, and per warm-up: the oracle's and the learned policy's verdicts (``_verdicts``)."""
    summaries, _ = run_scenario(scn, ["ours", *BASELINES])
    baselines = {b: summaries[b] for b in BASELINES}
    out: dict[str, Any] = {"name": scn.name, "ours": summaries["ours"]["meets_targets"], "warmups": {}}
    for warmup in warmups:
        out["warmups"][warmup] = (*_verdicts(scn, baselines, StaticOracle, warmup, budget),
                                  _verdicts(scn, baselines, LearnedStatic, warmup, budget)[1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_bound", description=__doc__.split("\n\n")[0],
                                 epilog="examples:" + __doc__.split("Examples:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=integer(1, 10_000), default=8, help="noise scenarios per seed (default 8)")
    ap.add_argument("--seeds", default="41", help="comma-separated draws of bench.sim_kinds (default 41)")
    ap.add_argument("--warmups", default="0,2,4,6", help="intervals at the initial weights (default 0,2,4,6)")
    ap.add_argument("--latency-budget", type=float, default=1.08,
                    help="the rule's bound on mean latency over the baselines' (default 1.08)")
    ap.add_argument("--jobs", type=integer(1, 64), default=1, help="processes (default 1)")
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        warmups = [int(x) for x in args.warmups.split(",") if x.strip()]
    except ValueError as exc:
        ap.error(f"--seeds/--warmups: comma-separated integers ({exc})")
    if not seeds or not warmups or min(seeds) < 0 or min(warmups) < 0 or not 1.0 <= args.latency_budget <= 2.0:
        ap.error("need at least one seed ≥ 0 and one warm-up ≥ 0, and a latency budget in [1, 2]")
    scenarios = [generate("noise", seed, i)[0] for seed in seeds for i in range(args.per_kind)]
    started, results = time.monotonic(), []
    with ProcessPoolExecutor(args.jobs) as pool:
        jobs = pool.map(bound_one, scenarios, [warmups] * len(scenarios), [args.latency_budget] * len(scenarios))
        for n, r in enumerate(jobs, 1):
            results.append(r)
            print(f"[{n}/{len(scenarios)}] {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    n = len(results)
    print(f"noise scenarios: {n} (seeds {','.join(map(str, seeds))})")
    print(f"ours as shipped meets every target: {sum(r['ours'] for r in results)}/{n}")
    rule = f"latency rule ≤ {args.latency_budget:g}"
    print(f"{'warm-up (intervals)':<20} {'some h meets':<14} {rule:<20} learned mean, {rule}")
    for w in warmups:
        some, oracle, learned = (sum(r["warmups"][w][i] for r in results) for i in range(3))
        print(f"{w:<20} {f'{some}/{n}':<14} {f'{oracle}/{n}':<20} {learned}/{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
