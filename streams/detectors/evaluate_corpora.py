"""Labelled corpora for backtesting detectors: SKAB (real sensor data, loaded from a directory the user
names), a fixed-seed synthetic corpus, and the project's own scenarios.

A corpus is a list of ``LabelledSeries``: timestamps, values and inclusive anomaly windows (row ranges).

* **SKAB** (Skoltech Anomaly Benchmark, Katser & Kozitsin 2020; GPL-3.0 data, never copied into this
  repository): one series per experiment file. Faults are multivariate and not every channel shows
  every fault, so each channel is scored by its own detector and the experiment's row score is the
  maximum over its channels (``SkabExperiment.channels`` keeps the channels for that).
* **Synthetic**: sine / ECG-like / random-walk / seasonal-operational bases with the anomaly kinds of the
  GutenTAG generator (Wenig et al. 2022: platform, mean, variance, frequency, pattern, trend, extremum)
  plus the operational ones this project pages on (a step out of a flat, zero-variance reading; a
  quantised integer series; a level drop). The generator is ours because the GutenTAG package pins
  a SciPy older than this project's.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from .evaluate_windows import labels_of, windows_from_labels
from .labelled_csv import read_labelled
from .series_text import ReplayError
from .scenarios import all_scenarios

SKAB_ENV = "OPSLOOP_SKAB_DIR"
SKAB_CHANNELS = ("Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature", "Thermocouple",
                 "Voltage", "Volume Flow RateRMS")


@dataclass
class LabelledSeries:
    name: str
    timestamps: list[float]
    values: list[float]
    windows: list[tuple[int, int]]
    channels: dict[str, list[float]] = field(default_factory=dict)   # multivariate sources, if any

    def labels(self) -> list[int]:
        return labels_of(len(self.values), self.windows)


# --------------------------------------------------------------------------------------------- SKAB
def skab_dir(explicit: str | None = None) -> Path | None:
    d = explicit or os.environ.get(SKAB_ENV)
    return Path(d) if d else None


def load_skab(root: Path) -> list[LabelledSeries]:
    """Every ``*.csv`` under ``root`` (or ``root/data``) in SKAB's ``;``-separated layout."""
    base = root / "data" if (root / "data").is_dir() else root
    files = sorted(p for p in base.rglob("*.csv"))
    if not files:
        raise FileNotFoundError(f"no SKAB csv files under {root}")
    out = []
    for p in files:
        try:
            found = read_labelled(p, SKAB_CHANNELS)
        except ReplayError as e:
            raise ValueError(f"{p}: not a SKAB file ({e})") from None
        labels = found.labels or [0] * len(found.timestamps)   # the anomaly-free file has no label column
        out.append(LabelledSeries(f"skab/{p.parent.name}/{p.stem}", found.timestamps,
                                  found.channels[SKAB_CHANNELS[0]], windows_from_labels(labels), found.channels))
    return out


# ---------------------------------------------------------------------------------------- synthetic
def _base(kind: str, n: int, rng: random.Random) -> list[float]:
    if kind == "sine":
        period = rng.choice((50, 100, 200))
        amp = rng.uniform(0.5, 2.0)
        return [amp * math.sin(2 * math.pi * i / period) + rng.gauss(0, 0.05 * amp) for i in range(n)]
    if kind == "ecg":
        period = rng.choice((60, 90))
        out = []
        for i in range(n):
            ph = (i % period) / period
            beat = math.exp(-((ph - 0.3) / 0.02) ** 2) * 2.0 + 0.3 * math.exp(-((ph - 0.6) / 0.06) ** 2)
            out.append(beat + rng.gauss(0, 0.03))
        return out
    if kind == "walk":
        x, out = 0.0, []
        for _ in range(n):
            x = 0.995 * x + rng.gauss(0, 0.1)
            out.append(x)
        return out
    if kind == "daily":        # 5-minute samples of a smooth daily load
        return [50 + 20 * math.sin(2 * math.pi * i / 288) + rng.gauss(0, 1.0) for i in range(n)]
    if kind == "flat":         # a DCMI reading: integer watts, constant
        return [248.0] * n
    if kind == "counts":       # quantised: requests per interval
        return [float(sum(1 for _ in range(20) if rng.random() < 0.25)) for _ in range(n)]
    raise ValueError(kind)


def _inject(kind: str, xs: list[float], a: int, b: int, rng: random.Random) -> None:
    seg = xs[a:b + 1]
    lo, hi = min(xs), max(xs)
    span = (hi - lo) or max(abs(xs[0]), 1.0)
    m = sum(seg) / len(seg)
    if kind == "platform":
        xs[a:b + 1] = [m] * len(seg)
    elif kind == "mean":
        d = rng.choice((-1, 1)) * rng.uniform(0.3, 0.6) * span
        xs[a:b + 1] = [v + d for v in seg]
    elif kind == "variance":
        xs[a:b + 1] = [v + rng.gauss(0, 0.25 * span) for v in seg]
    elif kind == "frequency":
        xs[a:b + 1] = [xs[a + (2 * (i - a)) % len(seg)] for i in range(a, b + 1)]
    elif kind == "pattern":
        xs[a:b + 1] = [m + (v - m) * -1.0 for v in seg]
    elif kind == "trend":
        k = len(seg)
        xs[a:] = [v + span * 0.8 * min(i - a, k) / k for i, v in enumerate(xs[a:], start=a)]
    elif kind == "extremum":
        xs[a] = hi + rng.uniform(0.5, 1.0) * span
    elif kind == "step":
        xs[a:] = [600.0] * (len(xs) - a)
    elif kind == "drop":
        xs[a:b + 1] = [v * 0.5 for v in seg]
    else:
        raise ValueError(kind)


SYNTHETIC = (("sine", "platform"), ("sine", "mean"), ("sine", "variance"), ("sine", "frequency"),
             ("sine", "extremum"), ("ecg", "pattern"), ("ecg", "extremum"), ("ecg", "variance"),
             ("walk", "trend"), ("walk", "extremum"), ("walk", "variance"), ("daily", "mean"),
             ("daily", "extremum"), ("daily", "none"), ("flat", "step"), ("counts", "mean"), ("counts", "drop"),
             ("counts", "none"))


def synthetic(seed: int = 2024, n: int = 3000) -> list[LabelledSeries]:
    """The fixed-seed synthetic corpus: one series per (base, anomaly kind), two events each."""
    out = []
    for k, (base, kind) in enumerate(SYNTHETIC):
        rng = random.Random(seed * 1000 + k)
        xs = _base(base, n, rng)
        windows: list[tuple[int, int]] = []
        if kind != "none":
            events = (int(n * 0.93),) if kind in ("trend", "step") else (int(n * rng.uniform(0.35, 0.5)),
                                                                           int(n * rng.uniform(0.7, 0.85)))
            for e in events:
                length = 1 if kind == "extremum" else rng.randint(40, 120)
                _inject(kind, xs, e, min(n - 1, e + length - 1), rng)
                windows.append((e, min(n - 1, e + length - 1)))
        step = 300.0 if base == "daily" else 60.0
        ts = [1_704_067_200 + i * step for i in range(n)]
        out.append(LabelledSeries(f"synthetic/{base}-{kind}", ts, xs, windows))
    return out


def scenario_corpus() -> list[LabelledSeries]:
    return [LabelledSeries(f"scenario/{s.name}", s.timestamps, s.values, list(s.windows)) for s in all_scenarios()]
