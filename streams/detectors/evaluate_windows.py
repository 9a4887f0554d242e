"""Window scoring of anomaly scores against labelled anomaly windows (the NAB convention).

The scoring is the one of the Numenta Anomaly Benchmark (Lavin & Ahmad, "Evaluating Real-time Anomaly
Detection Algorithms - the Numenta Anomaly Benchmark", IEEE ICMLA 2015), written down in
docs/anomaly-window-scoring.md:

* a row *alarms* when its score is >= the threshold;
* inside a labelled window only the first alarm counts, weighted by a scaled sigmoid of its position:
  the window's first row earns ``A_tp`` (1), its last row about 0;
* a window with no alarm costs ``A_fn``;
* each alarmed row outside every window costs ``A_fp`` times a sigmoid of its distance past the
  preceding window (an alarm just after a window is cheap, one far from any window costs the full
  ``A_fp``; before the first window the full ``A_fp``);
* rows of the probationary period (the first 15 % of each series, at most 750 rows) are not scored;
* one threshold for the whole corpus, the one that maximises the corpus' raw score (a sweep over every
  distinct score); normalised so that never alarming is 0 and the perfect detector is 100.

Profiles: standard (A_fp=0.11, A_fn=1), reward_low_fp (A_fp=0.22), reward_low_fn (A_fn=2); A_tp=1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

PROBATION_FRACTION = 0.15
PROBATION_MAX_ROWS = 750


@dataclass(frozen=True, slots=True)
class CostProfile:
    name: str
    tp: float = 1.0
    fp: float = 0.11
    fn: float = 1.0


PROFILES = (CostProfile("standard"), CostProfile("reward_low_fp", fp=0.22), CostProfile("reward_low_fn", fn=2.0))


@dataclass
class SeriesResult:
    name: str
    windows: int
    detected: int
    false_alarm_rows: int
    raw: float


@dataclass
class WindowScore:
    profile: str
    threshold: float
    score: float                  # normalised: 0 = never alarming, 100 = perfect
    raw: float
    windows: int
    detected: int
    false_alarm_rows: int
    per_series: list[SeriesResult] = field(default_factory=list)


def scaled_sigmoid(x: float) -> float:
    """NAB's weighting: 2/(1+e^(5x)) - 1, and -1 beyond 3 window lengths."""
    if x > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * x)) - 1.0


def probation_rows(n: int) -> int:
    return min(int(PROBATION_FRACTION * n), PROBATION_MAX_ROWS)


def windows_from_labels(labels: Sequence[int | float | bool]) -> list[tuple[int, int]]:
    """Maximal runs of non-zero labels as inclusive (first row, last row) windows."""
    out: list[tuple[int, int]] = []
    start = None
    for i, y in enumerate(labels):
        if y and start is None:
            start = i
        elif not y and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(labels) - 1))
    return out


def labels_of(n: int, windows: Sequence[tuple[int, int]]) -> list[int]:
    """Per-row labels (1 inside a window) of a series of n rows: the inverse of windows_from_labels."""
    lab = [0] * n
    for a, b in windows:
        for i in range(a, b + 1):
            lab[i] = 1
    return lab


def windows_around_events(n: int, events: Sequence[int]) -> list[tuple[int, int]]:
    """The convention for point labels: each window is 10 % of the series divided by the number of
    events, centred on the event's first row, clipped to the series; overlapping windows merge."""
    if not events:
        return []
    width = max(1, int(0.1 * n / len(events)))
    out: list[tuple[int, int]] = []
    for e in sorted(events):
        a, b = max(0, e - width // 2), min(n - 1, e - width // 2 + width - 1)
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _row_weights(n: int, windows: Sequence[tuple[int, int]]) -> tuple[list[int], list[float]]:
    """Per row: the window index it lies in (-1 outside, -2 probationary) and its sigmoid weight."""
    where = [-1] * n
    weight = [-1.0] * n
    prev: tuple[int, int] | None = None
    wins = sorted(windows)
    k = 0
    for i in range(n):
        while k < len(wins) and wins[k][1] < i:
            prev = wins[k]
            k += 1
        if k < len(wins) and wins[k][0] <= i <= wins[k][1]:
            a, b = wins[k]
            width = b - a + 1
            where[i] = k
            weight[i] = scaled_sigmoid(-(b - i + 1) / width)
        elif prev is not None:
            width = prev[1] - prev[0] + 1
            weight[i] = scaled_sigmoid(abs(prev[1] - i) / max(width - 1, 1))
    for i in range(min(probation_rows(n), n)):
        if where[i] < 0:
            where[i] = -2
    return where, weight


def window_score(corpus: Sequence[tuple[str, Sequence[float], Sequence[tuple[int, int]]]],
                 profile: CostProfile = PROFILES[0]) -> WindowScore:
    """Best-threshold window score of a corpus of (name, scores, windows)."""
    max_tp = scaled_sigmoid(-1.0)
    rows: list[tuple[float, int, int]] = []          # (score, series, row)
    prepared = []
    total_windows = 0
    for s, (_, scores, windows) in enumerate(corpus):
        where, weight = _row_weights(len(scores), windows)
        prepared.append((where, weight, len(windows)))
        total_windows += len(windows)
        for i, v in enumerate(scores):
            if where[i] != -2 and v > 0.0:
                rows.append((float(v), s, i))
    rows.sort(key=lambda r: -r[0])
    null = -profile.fn * total_windows
    perfect = profile.tp * total_windows
    # Sweep thresholds from high to low; the state is the best TP weight per (series, window).
    best_tp: dict[tuple[int, int], float] = {}
    tp_sum = fp_sum = 0.0
    fp_rows = 0
    best = (null, math.inf, 0, 0)                     # raw, threshold, detected, fp rows
    j = 0
    while j < len(rows):
        thr = rows[j][0]
        while j < len(rows) and rows[j][0] == thr:
            _, s, i = rows[j]
            where, weight, _ = prepared[s]
            w = where[i]
            if w >= 0:
                val = profile.tp * weight[i] / max_tp
                old = best_tp.get((s, w))
                if old is None:
                    best_tp[(s, w)] = val
                    tp_sum += val
                elif val > old:
                    best_tp[(s, w)] = val
                    tp_sum += val - old
            else:
                fp_sum += profile.fp * weight[i]
                fp_rows += 1
            j += 1
        raw = tp_sum + fp_sum - profile.fn * (total_windows - len(best_tp))
        if raw > best[0]:
            best = (raw, thr, len(best_tp), fp_rows)
    raw, thr, detected, fps = best
    per_series = [_series_result(name, scores, prepared[s], thr, profile, max_tp)
                  for s, (name, scores, _) in enumerate(corpus)]
    norm = 100.0 * (raw - null) / (perfect - null) if perfect != null else 0.0
    return WindowScore(profile.name, thr, norm, raw, total_windows, detected, fps, per_series)


def _series_result(name: str, scores: Sequence[float], prep: tuple[list[int], list[float], int], thr: float,
                   profile: CostProfile, max_tp: float) -> SeriesResult:
    where, weight, n_windows = prep
    tp: dict[int, float] = {}
    fp = 0.0
    fp_rows = 0
    for i, v in enumerate(scores):
        if v < thr or where[i] == -2 or v <= 0.0:
            continue
        if where[i] >= 0:
            tp.setdefault(where[i], profile.tp * weight[i] / max_tp)
        else:
            fp += profile.fp * weight[i]
            fp_rows += 1
    raw = sum(tp.values()) + fp - profile.fn * (n_windows - len(tp))
    return SeriesResult(name, n_windows, len(tp), fp_rows, raw)


def all_profiles(corpus: Sequence[tuple[str, Sequence[float], Sequence[tuple[int, int]]]]) -> list[WindowScore]:
    return [window_score(corpus, p) for p in PROFILES]
