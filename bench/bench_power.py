"""Benchmark of the power detector's cost per collection round as the fleet grows.

One round = one ``ipmi_power`` reading per host, three generations, every host warm (past
``min_samples``). Rows per fleet size: seconds per round through the stream handler
(``PowerHandler``: the generation comparison once per generation and batch), beside the
per-sample comparison (``PowerDetector.update`` with the deviation check after every reading,
what the handler did before) timed in the same run on an identical warm detector. The handler also
sets its gauges; the baseline does not, so the comparison does not flatter the handler.

Sizes: 250, 500, 1,000 hosts (``quick``: 100, 250). Target: the handler's round grows linearly,
i.e. it stays below the per-sample baseline, whose cost grows with the square of the fleet.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from opsloop.records import Metric, metric
from opsloop.streams.detectors.power.handler import PowerHandler

FULL_SIZES = (250, 500, 1000)
QUICK_SIZES = (100, 250)
GENERATIONS = ("gen1", "gen2", "gen3")
T0 = 1_795_000_000.0


def _round(hosts: int, ts: float) -> list[Metric]:
    return [metric("ipmi_power", {"watts": 150.0 + (i % 7)},
                   {"host": f"bp-{i}", "generation": GENERATIONS[i % 3], "raw_capacity_tb": "96"}, ts)
            for i in range(hosts)]


def _row(hosts: int, value: float, baseline_value: float) -> dict[str, Any]:
    return {"benchmark": "power_round", "metric": f"{hosts} hosts: seconds per round", "value": value,
            "baseline": "per-sample generation comparison", "baseline_value": baseline_value,
            "ratio": value / baseline_value if baseline_value else float("inf"), "unit": "s",
            "target": "below the per-sample baseline (linear, not quadratic)", "ok": value < baseline_value}


def run(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for hosts in QUICK_SIZES if quick else FULL_SIZES:
        handler = PowerHandler()
        for k in range(3):
            handler.handle(_round(hosts, T0 + 15 * k), T0 + 15 * k)
        handler.drain_outbox()
        baseline_detector = copy.deepcopy(handler.detector)
        batch = _round(hosts, T0 + 60)
        start = time.perf_counter()
        handler.handle(batch, T0 + 60)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        for m in batch:
            baseline_detector.update({"host": m.tags["host"], "watts": m.fields["watts"], "timestamp": m.timestamp})
        baseline = time.perf_counter() - start
        rows.append(_row(hosts, ours, baseline))
    return rows


if __name__ == "__main__":
    from bench.single import main

    raise SystemExit(main("bench.bench_power", __doc__, run))
