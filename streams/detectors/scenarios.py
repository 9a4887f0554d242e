"""Labeled scenarios built from the source documents' figures (docs/sources.md), for tests, tuning and ``make bench``.

Each scenario is a series (timestamps, values) with per-row labels and the anomaly windows
(first row, last row). Generation is deterministic (seeded ``random.Random``); ``write_csv``
materialises them as ``timestamp,value,label`` files (tests/streams/detectors/scenarios/), which
``opsloop detect replay`` reads directly (the label column is ignored by the detector).

Figures used: Keystone validation < 10 ms cached vs >= 600 ms uncached, nightly accounting
peak 03:10-04:10 (normal, never labeled); Gen 3 storage server 155 W, Gen 1 248 W, idle 136 W,
disks in standby 82 W; netperf 8.42 Gb/s (new kernel, 8 queues) vs 3.57 Gb/s (old kernel).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from .evaluate_windows import labels_of, windows_from_labels

START = 1_704_067_200  # 2024-01-01 00:00:00 UTC, a Monday
DAY = 86400


@dataclass
class Scenario:
    name: str
    timestamps: list[float]
    values: list[float]
    windows: list[tuple[int, int]] = field(default_factory=list)   # labeled anomalies, inclusive rows
    description: str = ""

    @property
    def labels(self) -> list[int]:
        return labels_of(len(self.values), self.windows)


def _tod_h(t: float) -> float:
    return (t % DAY) / 3600.0


def _nightly(t: float) -> bool:
    h = _tod_h(t)
    return 3 + 10 / 60 <= h < 4 + 10 / 60


def keystone_latency(seed: int = 1) -> Scenario:
    """Token validation latency, 5-min p50, 14 days: cached ~9 ms; nightly peak x3; then anomalies."""
    rng = random.Random(seed)
    ts, vs = [], []
    n = 14 * 288
    for i in range(n):
        t = START + i * 300
        v = 9.0 * math.exp(rng.gauss(0, 0.12)) * (1 + 0.2 * math.sin(2 * math.pi * _tod_h(t) / 24))
        if _nightly(t):
            v *= 3.0
        ts.append(t)
        vs.append(v)
    windows = []
    spike = 9 * 288 + 150
    vs[spike] = 120.0
    windows.append((spike, spike + 2))
    lo, hi = 11 * 288 + 100, 11 * 288 + 172          # 6 h without the credential cache: ~600 ms
    for i in range(lo, hi):
        vs[i] = 600.0 * math.exp(rng.gauss(0, 0.1))
    windows += [(lo, lo + 12), (hi, hi + 12)]
    return Scenario("keystone_latency", ts, vs, windows,
                    "Keystone validation p50 (ms): nightly peak normal; one spike; a 6 h regime 10 -> 600 ms")


def keystone_load_nightly(seed: int = 2) -> Scenario:
    """Validations/s with a daily shape, weekend dip and the nightly accounting peak; no anomaly."""
    rng = random.Random(seed)
    ts, vs = [], []
    for i in range(21 * 288):
        t = START + i * 300 + rng.uniform(-20, 20)      # irregular sampling
        if rng.random() < 0.01:
            continue                                    # gaps
        h = _tod_h(t)
        weekday = int(((t - START) // DAY) % 7)
        v = 40 + 25 * max(0.0, math.sin(math.pi * (h - 7) / 14)) if 7 <= h <= 21 else 40.0
        if weekday >= 5:
            v *= 0.6
        if _nightly(t):
            v += 120.0
        v *= math.exp(rng.gauss(0, 0.08))
        ts.append(t)
        vs.append(v)
    return Scenario("keystone_load_nightly", ts, vs, [],
                    "Keystone validations/s, 21 days, irregular timestamps, nightly peak 03:10-04:10: all normal")


def ipmi_power(seed: int = 3) -> Scenario:
    """Gen 3 storage server watts every minute for 5 days: 155 W; a fault draws +40 W; idle 136 -> 82 W."""
    rng = random.Random(seed)
    ts, vs = [], []
    n = 5 * 1440
    for i in range(n):
        ts.append(START + i * 60)
        vs.append(155.0 + rng.gauss(0, 1.5) + 4 * math.sin(2 * math.pi * i / 1440))
    windows = []
    a = 2 * 1440 + 300                                  # 2 h at +40 W (failing PSU / fans)
    for i in range(a, a + 120):
        vs[i] += 40.0
    windows += [(a, a + 119)]      # one event: the fault; its end is the return to normal, not a new one
    b = 3 * 1440 + 600                                  # drained: idle 136 W, then disks in standby 82 W
    for i in range(b, n):
        vs[i] = (136.0 if i < b + 240 else 82.0) + rng.gauss(0, 1.5)
    windows += [(b, b + 10), (b + 240, b + 250)]
    return Scenario("ipmi_power", ts, vs, windows, "Gen 3 server watts: fault +40 W, idle 136 W, standby 82 W")


def netperf_throughput(seed: int = 4) -> Scenario:
    """Hourly netperf sum (Gb/s) for 30 days at 8.42; a kernel regression to ~3.57 for a day."""
    rng = random.Random(seed)
    ts, vs = [], []
    for i in range(30 * 24):
        ts.append(START + i * 3600)
        vs.append(8.42 + rng.gauss(0, 0.08))
    a = 20 * 24
    for i in range(a, a + 24):
        vs[i] = 3.57 + rng.gauss(0, 0.05)
    return Scenario("netperf_throughput", ts, vs, [(a, a + 23)],
                    "netperf 8.42 Gb/s, regression to 3.57 Gb/s (old kernel) for one day")


def seasonal_mixed(seed: int = 5) -> Scenario:
    """Yahoo-like hourly series: daily + weekly season, slow trend, spikes, a variance and a trend change."""
    rng = random.Random(seed)
    n = 60 * 24
    ts, vs = [], []
    for i in range(n):
        t = START + i * 3600
        h, d = _tod_h(t), ((t - START) // DAY) % 7
        v = 100 + 0.01 * i + 20 * math.sin(2 * math.pi * h / 24) + (-15 if d >= 5 else 0) + rng.gauss(0, 2.0)
        ts.append(t)
        vs.append(v)
    windows = []
    for k in range(5):
        j = 10 * 24 + k * 200 + rng.randrange(0, 100)
        vs[j] += rng.choice((-1, 1)) * rng.uniform(18, 30)
        windows.append((j, j + 1))
    a = 45 * 24                                        # variance x5 for two days
    for i in range(a, a + 48):
        vs[i] += rng.gauss(0, 10.0)
    windows.append((a, a + 12))
    b = 52 * 24                                        # trend change: +1.5 per hour from there
    for i in range(b, n):
        vs[i] += 1.5 * (i - b)
    windows.append((b, b + 24))
    return Scenario("seasonal_mixed", ts, vs, windows, "hourly, daily+weekly season, spikes, variance and trend change")


def all_scenarios() -> list[Scenario]:
    return [keystone_latency(), keystone_load_nightly(), ipmi_power(), netperf_throughput(), seasonal_mixed()]


def write_csv(s: Scenario, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["timestamp", "value", "label"])
        for t, v, lab in zip(s.timestamps, s.values, s.labels):
            w.writerow([f"{t:.0f}", f"{v:.6g}", lab])


def read_csv(path: Path) -> Scenario:
    """Read a timestamp,value,label file back; windows are the runs of label 1."""
    ts, vs, labels = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            ts.append(float(row["timestamp"]))
            vs.append(float(row["value"]))
            labels.append(int(row["label"]))
    return Scenario(path.stem, ts, vs, windows_from_labels(labels))
