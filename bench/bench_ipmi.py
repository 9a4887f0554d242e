"""IPMI collector benchmark: BMC reads per minute with dead BMCs among them.

Starts a fleet of simulated BMCs (ipmi_sim, 10 % of them dead: nothing answers on their port),
runs full collector rounds with the configured concurrency bound, and reports reads per minute,
the peak number of ipmitool processes (sampled from /proc while rounds run) against the bound,
and the collector's CPU and memory. The baseline, measured in the same run, is sequential
reading (concurrency 1, one ipmitool at a time) over a subset with the same share of dead BMCs.

    .venv/bin/python -m bench.bench_ipmi [--quick]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from opsloop.collectors.ipmi import Config, build
from opsloop.lab.bmcsim import BMCFleet, BMCSpec
from opsloop.lab.bmcsim.procs import live_children

DEAD_SHARE = 0.10
CONCURRENCY = 16
TARGET_READS_PER_MIN = 1000.0
SEQUENTIAL_SUBSET = 20


class ProcessSampler(threading.Thread):
    """Counts this process's live ipmitool children in /proc until stopped; keeps the peak."""

    def __init__(self, interval_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, len(ipmitool_children()))
            self.samples += 1
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def ipmitool_children() -> list[int]:
    return live_children("ipmitool")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _specs(count: int, prefix: str) -> list[BMCSpec]:
    dead_every = round(1 / DEAD_SHARE)
    return [BMCSpec(f"{prefix}{i:03d}", watts=136 + (i * 7) % 120, dead=(i % dead_every == dead_every - 1),
                    poll_ms=1000) for i in range(count)]


def _collector(fleet: BMCFleet, names: list[str], root: Path, concurrency: int):  # type: ignore[no-untyped-def]
    inv = fleet.inventory()
    inv["hosts"] = [h for h in inv["hosts"] if h["name"] in set(names)]
    path = root / f"inventory-{concurrency}.yaml"
    path.write_text(yaml.safe_dump(inv))
    return build(Config.model_validate({"inventory": str(path), "concurrency": concurrency, "timeout_s": 6,
                                        "round_timeout_s": 600}))


def _measure(collector, rounds: int, sample: bool) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Run rounds; with ``sample`` also watch /proc for the peak process count (costs CPU, so the
    CPU and throughput figures come from rounds run without the sampler)."""
    sampler = ProcessSampler() if sample else None
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if sampler:
        sampler.start()
    started = time.monotonic()
    ok = attempted = 0
    try:
        for _ in range(rounds):
            rnd = collector.collect()
            ok += sum(1 for m in rnd.metrics if m.name == "ipmi_power")
            attempted += sum(1 for m in rnd.metrics if m.name == "ipmi_bmc")
    finally:
        elapsed = time.monotonic() - started
        if sampler:
            sampler.stop()
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_self = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
    cpu_kids = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    return {"elapsed_s": elapsed, "ok": ok, "attempted": attempted, "peak": sampler.peak if sampler else -1,
            "reads_per_min": ok / elapsed * 60, "attempts_per_min": attempted / elapsed * 60,
            "cpu_self_per_read_ms": cpu_self / max(attempted, 1) * 1000,
            "cpu_tool_per_read_ms": cpu_kids / max(attempted, 1) * 1000,
            "cpu_self_share": cpu_self / elapsed, "leftover": len(ipmitool_children())}


def _row(metric: str, value: float, baseline: str, baseline_value: float, unit: str, target: str,
         ok: bool | None, higher_is_better: bool = True) -> dict[str, object]:
    if baseline_value:
        ratio = value / baseline_value if higher_is_better else baseline_value / value if value else float("inf")
    else:
        ratio = float("nan")
    return {"benchmark": "ipmi_collector", "metric": metric, "value": round(value, 3), "baseline": baseline,
            "baseline_value": round(baseline_value, 3), "ratio": round(ratio, 3), "unit": unit, "target": target,
            "ok": ok}


def run(quick: bool = False) -> list[dict]:
    count = 40 if quick else 200
    rounds = 1 if quick else 2
    rss_before = rss_mb(os.getpid())
    with tempfile.TemporaryDirectory(prefix="bench-ipmi-") as tmp:
        root = Path(tmp)
        fleet = BMCFleet(_specs(count, "bmc"), root)
        t0 = time.monotonic()
        fleet.start(timeout_s=120)
        try:
            fleet_start_s = time.monotonic() - t0
            sim_rss = sum(rss_mb(pid) for pid in fleet.pids())
            names = [b.name for b in fleet]
            dead = sum(1 for b in fleet if b.spec.dead)

            subset = names[:SEQUENTIAL_SUBSET]
            seq = _measure(_collector(fleet, subset, root, 1), 1, sample=False)
            concurrent = _collector(fleet, names, root, CONCURRENCY)
            peak = _measure(concurrent, 1, sample=True)
            conc = _measure(concurrent, rounds, sample=False)
        finally:
            fleet.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    base = f"sequential, {SEQUENTIAL_SUBSET} BMCs ({int(SEQUENTIAL_SUBSET * DEAD_SHARE)} dead)"
    return [
        # The target is for the 200-BMC fleet: in --quick's one short round the dead BMCs' timeouts
        # are most of the elapsed time, so the quick figure is reported, not judged.
        _row(f"BMC reads/min ({count} BMCs, {dead} dead, concurrency {CONCURRENCY})", conc["reads_per_min"],
             base, seq["reads_per_min"], "reads/min",
             f">= {TARGET_READS_PER_MIN:g}" + (" (full run only)" if quick else ""),
             None if quick else conc["reads_per_min"] >= TARGET_READS_PER_MIN),
        _row("BMC attempts/min (incl. dead)", conc["attempts_per_min"], base, seq["attempts_per_min"],
             "attempts/min", "", None),
        _row("peak ipmitool processes (sampled every 5 ms)", peak["peak"], "concurrency bound", CONCURRENCY,
             "processes", f"<= {CONCURRENCY}", 0 < peak["peak"] <= CONCURRENCY, higher_is_better=False),
        _row("ipmitool processes left after rounds", conc["leftover"] + peak["leftover"], "none", 0, "processes",
             "0", conc["leftover"] + peak["leftover"] == 0, higher_is_better=False),
        _row("collector CPU per BMC read", conc["cpu_self_per_read_ms"], base, seq["cpu_self_per_read_ms"],
             "ms CPU", "", None, higher_is_better=False),
        _row("ipmitool CPU per BMC read", conc["cpu_tool_per_read_ms"], base, seq["cpu_tool_per_read_ms"],
             "ms CPU", "", None, higher_is_better=False),
        _row("collector CPU share while reading", conc["cpu_self_share"] * 100, base, seq["cpu_self_share"] * 100,
             "% of a core", "", None, higher_is_better=False),
        _row("collector peak RSS", rss_after, "RSS before the fleet", rss_before, "MiB", "", None,
             higher_is_better=False),
        _row(f"ipmi_sim RSS, {count - dead} simulators", sim_rss, "per simulator", sim_rss / max(count - dead, 1),
             "MiB", "", None, higher_is_better=False),
        _row(f"fleet start-up ({count} BMCs)", fleet_start_s, "", 0.0, "s", "", None),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m bench.bench_ipmi --quick   # 40 BMCs, one round\n"
               "  python -m bench.bench_ipmi           # 200 BMCs, two rounds",
    )
    parser.add_argument("--quick", action="store_true", help="40 simulated BMCs and one round")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick)
    for r in rows:
        print(f"{r['metric']:<58} {r['value']:>10} {r['unit']:<12} baseline {r['baseline_value']:>9} "
              f"({r['baseline']}) ratio {r['ratio']:>7} ok={r['ok']}")
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
