"""The symptoms on-call reported against the general detector, each a test (flat baseline, daily
pattern, alarm runs), plus the causal prefix check on every corpus series we can see."""

from __future__ import annotations

import math
import random

import pytest

from opsloop.streams.detectors.anomaly.model import NEW_IN_V2, DetectorConfig, StreamingDetector, score_series
from opsloop.lab.pipeline import LAB_ANOMALY
from opsloop.streams.detectors.evaluate_corpora import scenario_corpus, synthetic
from opsloop.streams.detectors.evaluation import alarms

T0 = 1_704_067_200.0


def test_step_out_of_a_flat_reading_scores_high_once() -> None:
    """248 W constant (a DCMI reading), then 600 W: the step is the easiest anomaly there is."""
    ts = [T0 + 5 * i for i in range(400)]
    vs = [248.0] * 200 + [600.0] * 200
    scores = score_series(ts, vs)
    assert max(scores[:200]) == 0.0
    assert scores[200] >= 0.99
    assert sum(1 for s in scores[201:] if s >= 0.5) == 0     # one event, one high score


@pytest.mark.parametrize("to", [0.0, 200.0, 250.0])
def test_drop_or_small_step_out_of_a_flat_reading_is_seen(to: float) -> None:
    ts = [T0 + 5 * i for i in range(300)]
    scores = score_series(ts, [248.0] * 200 + [to] * 100)
    assert scores[200] >= 0.9 and max(scores[:200]) == 0.0


def test_quantised_integer_series_step() -> None:
    """Integer watts with a 1 W jitter: the resolution is the floor, a 10 W step is an event."""
    rng = random.Random(5)
    ts = [T0 + 60 * i for i in range(1500)]
    vs = [float(155 + rng.choice((-1, 0, 0, 1))) for _ in range(1000)] + [165.0] * 500
    scores = score_series(ts, vs)
    assert scores[1000] >= 0.9
    assert max(scores[150:1000]) < 0.5


@pytest.mark.parametrize("noise", [0.0, 0.5, 3.0])
def test_smooth_daily_pattern_without_anomaly_raises_no_alarm(noise: float) -> None:
    """5-minute samples of a daily cycle for 14 days: no alarm run after the first day."""
    rng = random.Random(11)
    ts = [T0 + 300 * i for i in range(14 * 288)]
    vs = [100 + 30 * math.sin(2 * math.pi * i / 288) + rng.gauss(0, noise) for i in range(len(ts))]
    scores = score_series(ts, vs)
    assert alarms(scores, 0.5, start=288) == []


def test_one_event_is_scored_once_then_quiet_until_back_in_band() -> None:
    """A 30-point excursion: one high score at its start, nothing while it lasts, nothing on return."""
    rng = random.Random(3)
    ts = [T0 + 60 * i for i in range(2000)]
    vs = [50 + rng.gauss(0, 1) for _ in range(2000)]
    for i in range(1200, 1230):
        vs[i] += 25
    scores = score_series(ts, vs)
    high = [i for i, s in enumerate(scores) if s >= 0.5]
    assert high == [1200]
    # The detector still knows the series is out of its band (the finding stays open meanwhile).
    det = StreamingDetector()
    for t, v in zip(ts[:1215], vs[:1215]):
        det.update(t, v)
    assert det.in_event


def test_a_second_event_after_the_first_cleared_alarms_again() -> None:
    rng = random.Random(4)
    ts = [T0 + 60 * i for i in range(3000)]
    vs = [50 + rng.gauss(0, 1) for _ in range(3000)]
    vs[1200] += 30
    vs[2200] -= 30
    scores = score_series(ts, vs)
    assert [i for i, s in enumerate(scores) if s >= 0.5] == [1200, 2200]


@pytest.mark.parametrize("series", synthetic(n=1500) + scenario_corpus(), ids=lambda s: s.name)
def test_prefix_gives_identical_scores(series) -> None:
    """Causality: the scores of a prefix are exactly the first scores of the whole series."""
    whole = score_series(series.timestamps, series.values)
    cut = len(series.values) * 2 // 3
    assert score_series(series.timestamps[:cut], series.values[:cut]) == whole[:cut]


def test_state_of_the_previous_version_still_loads() -> None:
    det = StreamingDetector(DetectorConfig(warmup_points=5))
    for i in range(50):
        det.update(T0 + 60 * i, 10.0 + (i % 3))
    doc = det.to_dict()
    doc["version"] = 1
    for name in NEW_IN_V2:
        doc.pop(name)
    restored = StreamingDetector.from_dict(doc)
    assert restored.l_mean == pytest.approx(det.level0)
    assert restored.update(T0 + 60 * 50, 500.0) >= 0.9


def test_sparse_counts_learn_their_resolution_instead_of_alarming_forever() -> None:
    """0, 0, ..., 1, 0, 2, ...: the first non-zero may alarm, the series' normal life must not."""
    rng = random.Random(2)
    vs = [0.0] * 300 + [float(rng.random() < 0.03) * rng.choice((1, 1, 2)) for _ in range(2700)]
    scores = score_series([T0 + 60 * i for i in range(3000)], vs)
    assert sum(1 for s in scores if s >= 0.5) <= 1


def test_repeated_power_jumps_out_of_a_flat_reading() -> None:
    """248 W with an excursion to 600 W every 200 samples. 248 -> 600 is not the series' resolution, so
    with novelty off (the lab's setting, the demo repeats its jump) every jump alarms; by default a level
    the series has spent a quarter of its life at is no longer news after the first time."""
    vs = [248.0] * 200 + ([600.0] * 50 + [248.0] * 150) * 4
    ts = [T0 + 5 * i for i in range(len(vs))]
    lab = DetectorConfig(**LAB_ANOMALY["detector"])
    assert [i for i, s in enumerate(score_series(ts, vs, lab)) if s >= 0.5] == [200, 400, 600, 800]
    assert [i for i, s in enumerate(score_series(ts, vs)) if s >= 0.5] == [200]


def test_a_stuck_sensor_is_a_variance_change_and_alarms_once() -> None:
    rng = random.Random(9)
    vs = [20 + rng.gauss(0, 0.5) for _ in range(3000)]
    for i in range(2000, 2100):
        vs[i] = vs[1999]
    scores = score_series([T0 + 60 * i for i in range(3000)], vs)
    assert [i for i, s in enumerate(scores) if s >= 0.5] == [2009]


def test_integer_counts_with_long_zero_runs_do_not_look_stuck() -> None:
    rng = random.Random(9)
    vs = [float(sum(1 for _ in range(40) if rng.random() < 2 / 40)) for _ in range(6000)]
    scores = score_series([T0 + 60 * i for i in range(6000)], vs)
    # (a rare large count may alarm; a repeated value never does)
    assert [i for i, s in enumerate(scores) if s >= 0.5 and vs[i] == vs[i - 1]] == []
