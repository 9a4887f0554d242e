"""A fixed-seed synthetic corpus of *operational* series, labelled the way public benchmarks label them.

Why: the GutenTAG-style corpus (``evaluate_corpora.synthetic``) is clean sines, ECGs and walks with
textbook anomalies. Real monitoring data is messier, and a detector tuned on clean data floods on it.
This generator draws, per seed, one series of each kind below with random parameters:

* server CPU with short normal bursts and a labelled regime change or saturation;
* request rates with a daily + weekly profile, a holiday (normal) and an outage or surge;
* network traffic with heavy-tailed (log-normal, Pareto spike) noise and a sustained burst or drop;
* random walks with drift and a jump; slow trends (disk filling) then a break in slope or level;
* quantised / integer counts (Poisson) with a rate change; sparse series (mostly 0) that turn busy;
* short non-daily periods (12 / 24 / 48 / 96 samples) with an amplitude change, a missing cycle or a spike;
* variance changes; steps up or down; a stuck sensor (flatline) on a noisy daily signal;
* latency (log-normal, daily bump) with a regime change;
* one normal series of several kinds (no anomaly at all), so false alarms cost something.

Sampling artefacts are applied at random: irregular steps (jitter), missing rows and hour-long gaps,
sample-and-hold repeats, rounding to a resolution. Labels follow the usual convention for point
labels: a window of 10 % of the series' length (divided by the number of events) centred on each
event's first row (``windows_around_events``), so an alarm a little before the event still counts.

Seeds are split into a tuning half and a reporting half (``TUNE_SEEDS`` / ``REPORT_SEEDS``): a
detector is tuned on the first and reported on the second, so the figures are not fitted to the data.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from .evaluate_corpora import LabelledSeries
from .evaluate_windows import windows_around_events

TUNE_SEEDS = tuple(range(101, 107))
REPORT_SEEDS = tuple(range(201, 207))
T0 = 1_704_067_200.0        # a Monday, 00:00 UTC
STEP = 300.0                # 5-minute samples


def _events(rng: random.Random, n: int, k: int, length: int) -> list[int]:
    """k event rows after the probationary 15 % (from 20 %), at least a window plus `length` apart."""
    gap = int(0.1 * n / max(k, 1)) + length
    for _ in range(100):
        ev = sorted(rng.randint(int(0.2 * n), int(0.92 * n) - length) for _ in range(k))
        if all(b - a > gap for a, b in zip(ev, ev[1:])):
            return ev
    return ev[:1]


def _ar(rng: random.Random, n: int, phi: float, sd: float) -> list[float]:
    e, out = 0.0, []
    k = sd * math.sqrt(1.0 - phi * phi)
    for _ in range(n):
        e = phi * e + rng.gauss(0.0, k)
        out.append(e)
    return out


def _daily(i: int, step: float = STEP) -> float:
    """0..1 daily load shape (low at night, two humps in the working day) for row i."""
    h = ((T0 + i * step) % 86400.0) / 3600.0
    return 0.15 + 0.85 * (math.exp(-((h - 11.0) / 3.0) ** 2) * 0.9 + math.exp(-((h - 16.0) / 2.5) ** 2) * 0.7) / 1.1


def _weekend(i: int, step: float = STEP) -> bool:
    return int(((T0 + i * step) // 86400.0) % 7) >= 5     # T0 is a Monday


# Each generator returns (values, anomaly event rows); `anom` False means a normal series.
def _cpu(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    level = rng.uniform(5.0, 40.0)
    noise = _ar(rng, n, 0.7, rng.uniform(0.05, 0.15) * level + 0.5)
    xs = [level + e for e in noise]
    i = 0
    while i < n:                                    # normal short bursts (cron, GC, a deploy)
        if rng.random() < 0.006:
            h = rng.uniform(15.0, 45.0)
            for j in range(i, min(n, i + rng.randint(1, 4))):
                xs[j] += h
            i += 5
        i += 1
    ev: list[int] = []
    if anom:
        kind = rng.choice(("shift", "saturate"))
        ev = _events(rng, n, 1 if kind == "shift" else rng.randint(1, 2), 60)
        for e in ev:
            if kind == "shift":
                d = rng.uniform(15.0, 40.0)
                xs[e:] = [v + d for v in xs[e:]]
            else:
                for j in range(e, min(n, e + rng.randint(20, 60))):
                    xs[j] = 97.0 + rng.uniform(0.0, 3.0)
    return [min(100.0, max(0.0, v)) for v in xs], ev


def _requests(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    peak = rng.uniform(200.0, 3000.0)
    holiday = rng.randint(2, max(3, n // 288 - 2))
    xs = []
    for i in range(n):
        day = i // 288
        f = 0.35 if (_weekend(i) or day == holiday) else 1.0
        mu = peak * _daily(i) * f
        xs.append(max(0.0, mu + rng.gauss(0.0, math.sqrt(mu) * 1.5)))
    ev: list[int] = []
    if anom:
        kind = rng.choice(("outage", "surge"))
        ev = _events(rng, n, rng.randint(1, 2), 40)
        for e in ev:
            f = rng.uniform(0.0, 0.3) if kind == "outage" else rng.uniform(1.8, 3.0)
            for j in range(e, min(n, e + rng.randint(6, 36))):
                xs[j] *= f
    return [float(round(v)) for v in xs], ev


def _traffic(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    base = rng.uniform(1e5, 1e7)
    sig = rng.uniform(0.3, 0.6)
    xs = []
    for i in range(n):
        v = base * (0.5 + _daily(i)) * math.exp(rng.gauss(0.0, sig))
        if rng.random() < 0.01:
            v *= rng.paretovariate(1.5)                # heavy-tailed normal spikes
        xs.append(v)
    ev: list[int] = []
    if anom:
        kind = rng.choice(("burst", "drop"))
        ev = _events(rng, n, 1, 60)
        for e in ev:
            f = rng.uniform(4.0, 8.0) if kind == "burst" else rng.uniform(0.01, 0.08)
            for j in range(e, min(n, e + rng.randint(20, 60))):
                xs[j] *= f
    return xs, ev


def _walk(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    sd = rng.uniform(0.5, 2.0)
    drift = rng.uniform(-0.05, 0.05) * sd
    ev = _events(rng, n, rng.randint(1, 2), 10) if anom else []
    x, xs = rng.uniform(-50.0, 50.0), []
    for i in range(n):
        x += drift + rng.gauss(0.0, sd)
        if i in ev:
            x += rng.choice((-1, 1)) * rng.uniform(15.0, 30.0) * sd
        xs.append(x)
    return xs, ev


def _trend(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    """Disk usage: a slow fill with small noise; the anomaly is a fill that suddenly runs fast, or a jump."""
    start, slope = rng.uniform(20.0, 50.0), rng.uniform(5.0, 20.0) / n
    noise = _ar(rng, n, 0.5, rng.uniform(0.05, 0.3))
    ev = _events(rng, n, 1, 100) if anom else []
    kind = rng.choice(("slope", "jump"))
    xs, x = [], start
    for i in range(n):
        x += slope
        if ev and i >= ev[0]:
            x += slope * 8.0 if kind == "slope" else 0.0
            if kind == "jump" and i == ev[0]:
                x += rng.choice((-1, 1)) * rng.uniform(3.0, 6.0)
        xs.append(round(x + noise[i], 2))
    return xs, ev


def _counts(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    lam = rng.uniform(0.3, 6.0)
    ev = _events(rng, n, rng.randint(1, 2), 80) if anom else []
    ends = {e: e + rng.randint(20, 80) for e in ev}
    f = rng.uniform(3.0, 6.0)
    xs = []
    for i in range(n):
        lm = lam * (f if any(a <= i < b for a, b in ends.items()) else 1.0)
        xs.append(float(_poisson(rng, lm)))
    return xs, ev


def _poisson(rng: random.Random, lam: float) -> int:
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _sparse(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    """Disk writes of an idle box: mostly 0, rare bursts; the anomaly is sustained activity."""
    xs = [rng.uniform(50.0, 500.0) if rng.random() < 0.02 else 0.0 for _ in range(n)]
    ev = _events(rng, n, 1, 80) if anom else []
    for e in ev:
        for j in range(e, min(n, e + rng.randint(30, 80))):
            xs[j] = rng.uniform(100.0, 400.0)
    return [round(v) for v in xs], ev


def _periodic(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    period = rng.choice((12, 24, 48, 96))
    amp = rng.uniform(2.0, 10.0)
    square = rng.random() < 0.4
    noise = _ar(rng, n, 0.3, amp * rng.uniform(0.05, 0.15))
    off = rng.uniform(0.0, 100.0)

    def shape(i: int) -> float:
        s = math.sin(2 * math.pi * i / period)
        return (1.0 if s >= 0 else -1.0) if square else s

    xs = [off + amp * shape(i) + noise[i] for i in range(n)]
    ev: list[int] = []
    if anom:
        kind = rng.choice(("amplitude", "missing", "spike"))
        ev = _events(rng, n, rng.randint(1, 2), 4 * period)
        for e in ev:
            if kind == "amplitude":
                f = rng.choice((0.1, 2.5))
                for j in range(e, min(n, e + rng.randint(2, 4) * period)):
                    xs[j] = off + f * amp * shape(j) + noise[j]
            elif kind == "missing":                      # a cycle that did not happen
                lvl = off + amp * shape(e)
                for j in range(e, min(n, e + period)):
                    xs[j] = lvl + noise[j]
            else:
                xs[e] = off + rng.choice((-1, 1)) * amp * rng.uniform(2.5, 4.0)
    return xs, ev


def _variance(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    sd = rng.uniform(0.5, 3.0)
    lvl = rng.uniform(-20.0, 100.0)
    xs = [lvl + e for e in _ar(rng, n, rng.uniform(0.0, 0.8), sd)]
    ev: list[int] = []
    if anom:
        ev = _events(rng, n, 1, 200)
        f = rng.uniform(4.0, 8.0)
        for j in range(ev[0], min(n, ev[0] + rng.randint(50, 200))):
            xs[j] = lvl + (xs[j] - lvl) * f
    return xs, ev


def _step(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    sd = rng.uniform(0.5, 3.0)
    lvl = rng.uniform(0.0, 200.0)
    xs = [lvl + e for e in _ar(rng, n, rng.uniform(0.0, 0.9), sd)]
    ev: list[int] = []
    if anom:
        ev = _events(rng, n, 1, 10)
        d = rng.choice((-1, 1)) * rng.uniform(4.0, 8.0) * sd
        xs[ev[0]:] = [v + d for v in xs[ev[0]:]]
    return xs, ev


def _stuck(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    """A temperature sensor (daily swing + noise) that freezes at its last value."""
    amp, lvl = rng.uniform(2.0, 8.0), rng.uniform(15.0, 35.0)
    noise = _ar(rng, n, 0.6, rng.uniform(0.2, 0.6))
    xs = [round(lvl + amp * (_daily(i) - 0.5) + noise[i], 1) for i in range(n)]
    ev: list[int] = []
    if anom:
        ev = _events(rng, n, 1, 300)
        for j in range(ev[0], min(n, ev[0] + rng.randint(60, 300))):
            xs[j] = xs[ev[0] - 1]
    return xs, ev


def _latency(rng: random.Random, n: int, anom: bool) -> tuple[list[float], list[int]]:
    base = rng.uniform(20.0, 300.0)
    sig = rng.uniform(0.15, 0.4)
    xs = [base * (0.8 + 0.5 * _daily(i)) * math.exp(rng.gauss(0.0, sig)) for i in range(n)]
    ev: list[int] = []
    if anom:
        ev = _events(rng, n, 1, 100)
        f = rng.uniform(2.5, 4.0)
        for j in range(ev[0], min(n, ev[0] + rng.randint(30, 100))):
            xs[j] *= f
    return [round(v, 1) for v in xs], ev


KINDS: dict[str, Callable[[random.Random, int, bool], tuple[list[float], list[int]]]] = {
    "cpu": _cpu, "requests": _requests, "traffic": _traffic, "walk": _walk, "trend": _trend,
    "counts": _counts, "sparse": _sparse, "periodic": _periodic, "variance": _variance, "step": _step,
    "stuck": _stuck, "latency": _latency,
}
NORMAL = ("cpu", "requests", "traffic", "walk", "periodic", "counts", "latency")


def _artefacts(rng: random.Random, xs: list[float], ev: list[int]) -> tuple[list[float], list[float], list[int]]:
    """Irregular sampling, missing rows and gaps, sample-and-hold; returns timestamps, values, events."""
    n = len(xs)
    jitter = rng.random() < 0.3
    drop = rng.random() < 0.3
    hold = rng.random() < 0.2
    ts, out, new_ev = [], [], []
    evs = set(ev)
    t = T0
    for i in range(n):
        step = STEP * (1.0 + (rng.uniform(-0.3, 0.3) if jitter else 0.0))
        if drop and rng.random() < 0.003:
            step += STEP * rng.randint(6, 36)          # an hour-long or longer gap
        t += step
        if drop and rng.random() < 0.02 and i not in evs:
            continue                                   # a missing row
        if i in evs:
            new_ev.append(len(out))
        v = xs[i]
        if hold and out and rng.random() < 0.1 and i not in evs:
            v = out[-1]                                # the exporter repeated its last value
        ts.append(t)
        out.append(v)
    return ts, out, new_ev


def ops_corpus(seeds: tuple[int, ...] = REPORT_SEEDS, n: int = 4000) -> list[LabelledSeries]:
    """One series per kind (with an anomaly) and per NORMAL kind (without), per seed."""
    out = []
    for seed in seeds:
        jobs = [(k, True) for k in KINDS] + [(k, False) for k in NORMAL]
        for j, (kind, anom) in enumerate(jobs):
            rng = random.Random(seed * 10_000 + j)
            length = int(n * rng.uniform(0.6, 1.0))
            xs, ev = KINDS[kind](rng, length, anom)
            ts, xs, ev = _artefacts(rng, xs, ev)
            name = f"ops/{seed}/{kind}" + ("" if anom else "-normal")
            out.append(LabelledSeries(name, ts, xs, windows_around_events(len(xs), ev)))
    return out
