"""The throughput collector: one round measures every due target set, the source documents' way.

Per run, every stream of the set starts at once (one process each, bounded by ``max_processes``) and
the streams' throughputs are added up; the run is repeated R times and the set reports the mean, min,
max and standard deviation in Gb/s of the sums of the *complete* runs (every stream answered for its
whole ``run_s``), once there are ``min_complete_runs`` of them. A run where a stream failed or ended early
is partial: its sum of the streams that answered is reported apart (``partial_mean_gbps``), never mixed into
``mean_gbps``; ``streams_ok`` of ``streams_attempted`` says how much was measured. A failed target is named in
the event (``failed``) and returned as a CollectError; the others are still measured.

A target *dead* in a measurement (``unreachable`` in every run: a VM gone, no netserver; it carried no traffic)
is left out of the set: a run is complete when every other target answered, and ``mean_gbps`` is the mean over
those targets, the dead ones named apart (``dead_targets``, ``dead``). The sum is bounded by the path under test,
not by the number of targets (the source documents: 8.42 Gb/s over six VMs, 8.75 over twelve), so the live
targets still measure it; before, one dead target made every run partial and the set had no ``mean_gbps`` for as
long as it stayed dead. A target that failed otherwise (a stream ended early, torn output, a time-out) may have
carried traffic the others' sums lack: its runs stay partial. Sets run one after another: two sets measured at
once would share the links they measure.
"""

from __future__ import annotations

import collections
import math
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from opsloop.collect.types import CollectError, CollectorUnavailable, Round
from opsloop.records import Metric, metric
from opsloop.validation import WireError

from opsloop.collectors.netperf.config import Config, Target, TargetSet
from opsloop.collectors.netperf.drivers import TEST, Driver, Outcome, check_length, driver_for
from opsloop.collectors.netperf.runner import Runner, ToolMissing
from opsloop.collectors.netperf.schedule import JitterSchedule, RoundGuard
from opsloop.collectors.netperf.stats import Summary, summarize
from opsloop.collectors.netperf.units import to_gbps

SET_METRIC = "netperf_throughput"
TARGET_METRIC = "netperf_target_throughput"
# A run is only started when it can end before the round's deadline with this much slack.
_START_SLACK_S = 1.0

_INSTALL_HINT = {
    "netperf": "install it (Debian: `apt-get install netperf`, from the non-free component) "
               "or set collectors.netperf.netperf_path",
    "iperf3": "install it (Debian: `apt-get install iperf3`) or set collectors.netperf.iperf3_path",
}


@dataclass
class _SetResult:
    """What one target set's measurement gathered, run by run."""

    # per run with a measured stream: each target that answered -> (its bits/s, every one of its streams did)
    runs: list[dict[Target, tuple[float, bool]]] = field(default_factory=list)
    per_target_bps: dict[Target, list[float]] = field(default_factory=dict)
    per_target_streams_ok: dict[Target, int] = field(default_factory=dict)
    failures: dict[Target, list[Outcome]] = field(default_factory=dict)
    reached: set[Target] = field(default_factory=set)   # targets with an outcome other than unreachable
    retransmits: int | None = None
    streams_ok: int = 0
    streams_attempted: int = 0
    short_streams: int = 0


def _gbps_fields(s: Summary) -> dict[str, float]:
    # 1 kbit/s resolution: far below what a throughput measurement can resolve.
    return {"mean_gbps": round(s.mean, 6), "min_gbps": round(s.minimum, 6), "max_gbps": round(s.maximum, 6),
            "stddev_gbps": round(s.stddev, 6)}


def _totals(runs: list[dict[Target, tuple[float, bool]]], live: list[Target]) -> tuple[list[float], list[float]]:
    """The sums of the complete runs (every live target answered with all its streams) and of the partial ones."""
    complete: list[float] = []
    partial: list[float] = []
    for measured in runs:
        total = sum(bps for bps, _ in measured.values())
        # Only a run where every live stream answered is the set's throughput; a partial sum is kept apart.
        whole = all(t in measured and measured[t][1] for t in live)
        (complete if whole else partial).append(total)
    return complete, partial


class NetperfCollector:
    name = "netperf"

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.runner = Runner(config.max_processes)
        self._clock = clock
        self._guard = RoundGuard(config.lock_file)
        self._schedules = {s.name: JitterSchedule(s.interval_s, s.jitter_s, clock, rng) for s in config.target_sets}
        self._drivers = {d: driver_for(d, config.netperf_path, config.iperf3_path) for d in config.drivers()}
        self._starved: set[str] = set()  # sets the last round's deadline left without a single run

    @property
    def busy(self) -> bool:
        """True while a round is measuring."""
        return self._guard.busy

    def check_tools(self) -> None:
        """Raise CollectorUnavailable when nothing could be attempted (tool missing, no privilege)."""
        for driver in sorted(self.config.drivers()):
            path = self.config.netperf_path if driver == "netperf" else self.config.iperf3_path
            if shutil.which(path) is None:
                raise CollectorUnavailable(f"{driver} not found ({path!r}): {_INSTALL_HINT[driver]}")
        if any(s.netns for s in self.config.target_sets):
            if shutil.which(self.config.ip_path) is None:
                raise CollectorUnavailable(f"target sets use netns but {self.config.ip_path!r} (iproute2) "
                                           "is not installed: `apt-get install iproute2`")
            if os.geteuid() != 0:
                raise CollectorUnavailable("target sets use netns: `ip netns exec` needs root "
                                           "(CAP_SYS_ADMIN); run the collector as root or drop netns")

    def collect(self) -> Round:
        self.check_tools()
        with self._guard.hold() as acquired:
            if not acquired:
                # Measuring now would measure the other round's traffic too.
                return Round(errors=[CollectError(self.name, "tool", "round skipped: a measurement is still "
                                                  "running on this host (this collector or lock_file "
                                                  f"{self.config.lock_file!r})")])
            deadline = self._clock() + self.config.max_round_s
            rnd = Round()
            due = [s for s in self.config.target_sets if self._schedules[s.name].due()]
            # A set the last round's deadline left unmeasured goes first: in config order, a set before it
            # that fills max_round_s would starve it every round.
            due.sort(key=lambda s: s.name not in self._starved)
            for tset in due:
                measured = True
                try:
                    measured = self._measure(tset, deadline, rnd)
                finally:
                    if measured:
                        self._starved.discard(tset.name)
                        self._schedules[tset.name].done()
                    else:
                        self._starved.add(tset.name)  # still due: not measured is not done
            return rnd

    # -- one target set -------------------------------------------------------------------------

    def _measure(self, tset: TargetSet, deadline: float, rnd: Round) -> bool:
        """Measure one set into ``rnd``; False when the round deadline left no time for even its first run."""
        if tset.netns and not os.path.exists(f"/run/netns/{tset.netns}"):
            rnd.errors.append(CollectError(tset.name, "tool", f"network namespace {tset.netns!r} does not exist "
                                                              "(see `ip netns list`)"))
            return True
        driver = self._drivers[tset.driver]
        targets = tset.parsed_targets()
        result = _SetResult(per_target_bps={t: [] for t in targets}, failures={t: [] for t in targets},
                            per_target_streams_ok={t: 0 for t in targets})
        # iperf3 carries all of a target's streams in one process: one outcome stands for that many.
        streams_each = tset.streams_per_target // driver.processes_per_target(tset)
        started_at, started = time.time(), self._clock()
        unmeasured = False
        for run in range(tset.repetitions):
            remaining = deadline - self._clock()
            if remaining < tset.run_s + _START_SLACK_S:
                rnd.errors.append(CollectError(tset.name, "timeout",
                                               f"round deadline (max_round_s={self.config.max_round_s:g}) "
                                               f"reached: {run} of {tset.repetitions} runs measured"))
                unmeasured = run == 0
                break
            timeout_s = min(tset.run_s + tset.timeout_margin_s, remaining)
            self._record_run(self._run_once(tset, driver, targets, timeout_s), targets, result, streams_each)
        duration_s = self._clock() - started
        try:
            rnd.metrics.extend(self._samples(tset, targets, result, started_at, duration_s))
        except WireError as e:
            # This set's samples are unusable; the other sets of the round still report theirs.
            rnd.errors.append(CollectError(tset.name, "parse", f"samples do not fit the wire format: {e}"))
        for target, failed in result.failures.items():
            if failed:
                kind = collections.Counter(o.kind for o in failed).most_common(1)[0][0]
                last = next(o for o in reversed(failed) if o.kind == kind)
                short = sum(o.short for o in failed)
                early = f" ({short} ended early)" if short and not last.short else ""
                dead = "" if target in result.reached else ", left out of the set's throughput"
                rnd.errors.append(CollectError(f"{tset.name}/{target}", kind or "tool",
                                               f"failed in {len(failed)} of {tset.repetitions} runs{early}{dead}: "
                                               f"{last.message}"))
        return not unmeasured

    def _run_once(self, tset: TargetSet, driver: Driver, targets: list[Target],
                  timeout_s: float) -> list[Outcome]:
        jobs = [(t, i) for t in targets for i in range(driver.processes_per_target(tset))]
        prefix = [self.config.ip_path, "netns", "exec", tset.netns] if tset.netns else []

        def one(job: tuple[Target, int]) -> Outcome:
            target, index = job
            try:
                done = self.runner.run(prefix + driver.argv(tset, target, index), timeout_s)
            except ToolMissing as e:
                return Outcome(target, kind="tool", message=str(e))
            return check_length(driver.interpret(done, tset, target, timeout_s), tset, driver.name)

        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix=f"netperf-{tset.name}") as pool:
            return list(pool.map(one, jobs))

    @staticmethod
    def _record_run(outcomes: list[Outcome], targets: list[Target], result: _SetResult, streams_each: int) -> None:
        by_target: dict[Target, list[Outcome]] = {t: [] for t in targets}
        for o in outcomes:
            by_target[o.target].append(o)
        total = 0.0
        measured: dict[Target, tuple[float, bool]] = {}   # the targets that answered in this run
        for target, outs in by_target.items():
            good = [o.result for o in outs if o.result is not None]
            bad = [o for o in outs if not o.ok]
            result.streams_attempted += len(outs) * streams_each
            if any(o.ok or o.kind != "unreachable" for o in outs):
                result.reached.add(target)
            result.short_streams += sum(o.short for o in bad) * streams_each
            if good:
                bps = sum(r.bits_per_second for r in good)
                if not math.isfinite(bps) or not math.isfinite(total + bps):
                    # Each stream was finite but their sum overflows: no usable figure for this target.
                    bad.append(Outcome(target, kind="parse",
                                       message=f"{target}: {len(good)} stream(s) sum to a non-finite bit rate "
                                               f"(largest {max(r.bits_per_second for r in good):g} bits/s)"))
                    good = []
            if good:
                total += bps
                measured[target] = (bps, not bad)
                result.streams_ok += len(good) * streams_each
                result.per_target_streams_ok[target] += len(good) * streams_each
                if not bad:
                    result.per_target_bps[target].append(bps)
                retrans = [r.retransmits for r in good if r.retransmits is not None]
                if retrans:
                    result.retransmits = (result.retransmits or 0) + sum(retrans)
            if bad:
                result.failures[target].append(bad[-1])
        if measured:
            result.runs.append(measured)

    def _samples(self, tset: TargetSet, targets: list[Target], result: _SetResult, started_at: float,
                 duration_s: float) -> list[Metric]:
        tags = {"host": self.config.host, "target_set": tset.name, "driver": tset.driver, "test": TEST,
                **tset.labels}
        failed = [str(t) for t in targets if result.failures[t]]
        # unreachable in every run: left out of the set (module docstring); all dead is no measurement at all
        dead = [t for t in targets if result.failures[t] and t not in result.reached]
        live = [t for t in targets if t not in dead]
        complete, partial_totals = _totals(result.runs, live)
        fields: dict[str, float | int | str] = {
            "runs": len(result.runs), "runs_planned": tset.repetitions, "complete_runs": len(complete),
            "targets": len(targets), "failed_targets": len(failed), "failed": ",".join(failed),
            "dead_targets": len(dead), "dead": ",".join(str(t) for t in dead),
            "streams": tset.streams, "streams_ok": result.streams_ok, "streams_attempted": result.streams_attempted,
            "short_streams": result.short_streams, "run_s": tset.run_s, "duration_s": round(duration_s, 3),
        }
        summary = summarize([to_gbps(x) for x in complete])
        if summary is not None and summary.n >= tset.min_complete_runs:
            fields.update(_gbps_fields(summary))
        partial = summarize([to_gbps(x) for x in partial_totals])
        if partial is not None:
            # Named apart so that no reader of mean_gbps takes N-1 of N streams for the set's throughput.
            fields["partial_mean_gbps"] = round(partial.mean, 6)
        if result.retransmits is not None:
            fields["retransmits"] = result.retransmits
        out = [metric(SET_METRIC, fields, tags, started_at)]
        for target in targets:
            per = summarize([to_gbps(x) for x in result.per_target_bps[target]])
            tfields: dict[str, float | int | str] = {
                "runs_ok": len(result.per_target_bps[target]), "runs_failed": len(result.failures[target]),
                "streams": tset.streams_per_target, "streams_ok": result.per_target_streams_ok[target]}
            if per is not None:
                tfields.update(_gbps_fields(per))
            ttags = {"host": self.config.host, "target_set": tset.name, "driver": tset.driver, "test": TEST,
                     "target": str(target), **tset.labels}
            out.append(metric(TARGET_METRIC, tfields, ttags, started_at))
        return out
