"""A value that is ordinary for the day but far out for its time of day pages under the seasonal model.

The novelty damping compares a value with the histogram of everything the series has shown. In a daily
series that histogram holds the whole cycle, so a spike to the afternoon's level in the middle of the
night was damped as "a level the series keeps returning to" (score ~0.05 at z ~7), although the seasonal
model, the one scoring, says it is far out for that hour. The damping is skipped for the seasonal model,
as it already was for the short-period one.
"""

from __future__ import annotations

import math
import random

from opsloop.streams.detectors import scenarios
from opsloop.streams.detectors.anomaly.model import StreamingDetector, score_series
from opsloop.streams.detectors.evaluation import evaluate

T0 = 1_704_067_200.0
STEP = 3600.0
PER_DAY = int(86400 / STEP)


def _daily(days: int, seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    ts = [T0 + STEP * i for i in range(days * PER_DAY)]
    vs = [100.0 + 20.0 * math.sin(2 * math.pi * (t % 86400) / 86400) + rng.gauss(0.0, 2.0) for t in ts]
    return ts, vs


def test_spike_to_the_daily_peak_level_at_night_pages_under_the_seasonal_model() -> None:
    ts, vs = _daily(21, seed=3)
    i = 18 * PER_DAY + 3 * PER_DAY // 4          # day 18, 18:00: the daily trough (~80)
    vs[i] = 112.0                                # the level of every late morning
    det = StreamingDetector()
    scores = [det.update(t, v) if k != i else -1.0 for k, (t, v) in enumerate(zip(ts, vs))]
    # the spike itself, scored with the model that explains it
    det = StreamingDetector()
    for t, v in zip(ts[:i], vs[:i]):
        det.update(t, v)
    score = det.update(ts[i], vs[i])
    e = det.explain()
    assert e["model"] == "seasonal", e
    assert e["z"] > 6.0, e
    assert score >= 0.5, (score, e)
    # ... and the same series pages nowhere else once its profile is learned (no flood without the damping)
    assert max(s for k, s in enumerate(scores) if k >= 3 * PER_DAY and k != i) < 0.5


def test_normal_daily_series_does_not_page_without_the_damping() -> None:
    for seed in (1, 2):
        ts, vs = _daily(21, seed=seed)
        scores = score_series(ts, vs)
        assert max(scores[3 * PER_DAY:]) < 0.5, seed


def test_seasonal_mixed_spikes_page_at_the_paging_level() -> None:
    """The scenario's spikes inside the daily range (z 5-7 under the seasonal model) page at 0.5: recall
    was 1/7 (only the spike below the whole range paged)."""
    s = scenarios.seasonal_mixed()
    scores = score_series(s.timestamps, s.values)
    e = evaluate(scores, s.timestamps, s.windows, 0.5, int(0.15 * len(scores)))
    assert e.detected >= 4, e
