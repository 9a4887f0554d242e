"""The general streaming detector: contract properties, seasonality, the source documents' scenarios."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.streams.detectors import scenarios
from opsloop.streams.detectors.anomaly.model import (MAX_ABS_VALUE, DetectorConfig, StreamingDetector,
                                                     score_series)
from opsloop.streams.detectors.evaluate_windows import window_score
from opsloop.streams.detectors.evaluation import evaluate

SCENARIO_DIR = Path(__file__).parent / "scenarios"
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
series = st.lists(st.tuples(st.floats(min_value=0.001, max_value=7200.0), finite), min_size=1, max_size=120)


def _stream(steps: list[tuple[float, float]], start: float = 1.7e9) -> tuple[list[float], list[float]]:
    ts, t = [], start
    for dt, _ in steps:
        t += dt
        ts.append(t)
    return ts, [v for _, v in steps]


@settings(max_examples=150, deadline=None)
@given(series)
def test_scores_always_in_unit_interval(steps: list[tuple[float, float]]) -> None:
    ts, vs = _stream(steps)
    for s in score_series(ts, vs, DetectorConfig(warmup_points=5)):
        assert 0.0 <= s <= 1.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0.001, max_value=7200.0),
                          st.one_of(finite, st.floats(allow_nan=False, allow_infinity=False))),
                min_size=1, max_size=150))
def test_any_finite_value_is_scored_or_refused_and_the_series_goes_on(steps: list) -> None:
    """Over the whole finite range (1e200, 5e-324, -1.7e308): a value beyond ``MAX_ABS_VALUE`` is
    refused with a ValueError naming it, before the state changes (the scores after it are those of
    a detector that never saw it); every other value scores in [0, 1], and the state stays JSON
    without NaN. Before, one value of 1e200 turned the running sums to inf and NaN, and every later
    point of that series raised."""
    ts, vs = _stream(steps)
    seen, clean = StreamingDetector(DetectorConfig(warmup_points=5)), StreamingDetector(DetectorConfig(warmup_points=5))
    for t, v in zip(ts, vs):
        if abs(v) > MAX_ABS_VALUE:
            with pytest.raises(ValueError, match=r"beyond ±1e\+50"):
                seen.update(t, v)
            continue
        score = seen.update(t, v)
        assert 0.0 <= score <= 1.0
        assert score == clean.update(t, v)
    json.dumps(seen.to_dict(), allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(series, series, st.data())
def test_no_look_ahead(prefix: list, other_tail: list, data: st.DataObject) -> None:
    """The score of row i does not change when rows after i change."""
    cfg = DetectorConfig(warmup_points=5)
    ts, vs = _stream(prefix + other_tail)
    base = score_series(ts, vs, cfg)
    cut = data.draw(st.integers(min_value=1, max_value=len(prefix)))
    changed = vs[:cut] + [v * -3.0 + 17.0 for v in vs[cut:]]
    assert score_series(ts, changed, cfg)[:cut] == base[:cut]


@settings(max_examples=60, deadline=None)
@given(series, series)
def test_state_round_trip_gives_identical_future_scores(head: list, tail: list) -> None:
    cfg = DetectorConfig(warmup_points=5)
    ts, vs = _stream(head + tail)
    k = len(head)
    straight = StreamingDetector(cfg)
    expected = [straight.update(t, v) for t, v in zip(ts, vs)][k:]
    first = StreamingDetector(cfg)
    for t, v in zip(ts[:k], vs[:k]):
        first.update(t, v)
    restored = StreamingDetector.from_dict(json.loads(json.dumps(first.to_dict(), allow_nan=False)))
    assert [restored.update(t, v) for t, v in zip(ts[k:], vs[k:])] == expected


def _keystone_day_series(days: int, seed: int = 3) -> tuple[list[float], list[float], list[bool]]:
    rng = random.Random(seed)
    ts, vs, peak = [], [], []
    for i in range(days * 288):
        t = 1_704_067_200 + i * 300 + rng.uniform(-30, 30)
        h = (t % 86400) / 3600
        in_peak = 3 + 10 / 60 <= h < 4 + 10 / 60
        ts.append(t)
        vs.append((50.0 + (150.0 if in_peak else 0.0)) * math.exp(rng.gauss(0, 0.1)))
        peak.append(in_peak)
    return ts, vs, peak


def test_nightly_peak_does_not_page_after_warm_up() -> None:
    ts, vs, peak = _keystone_day_series(14)
    scores = score_series(ts, vs)
    after = [s for s, t, p in zip(scores, ts, peak) if t - ts[0] >= 3 * 86400 and p]
    assert after, "the test series must contain nightly peaks after warm-up"
    assert max(after) < 0.5
    # ... while the first, unlearned, peak is surprising: the scale of the test is right.
    assert max(s for s, p in zip(scores[:288], peak[:288]) if p) >= 0.5


def test_missing_nightly_peak_or_spike_after_warm_up_pages() -> None:
    ts, vs, peak = _keystone_day_series(10)
    i = 9 * 288 + 140                          # daytime, day 10
    vs[i] *= 6.0
    scores = score_series(ts, vs)
    assert scores[i] >= 0.5
    assert max(scores[i + 3: i + 60]) < 0.5    # one spike, one alarm: the level is not dragged


def test_level_shift_alarms_then_settles() -> None:
    rng = random.Random(5)
    ts = [1.7e9 + 60 * i for i in range(2000)]
    vs = [10.0 + rng.gauss(0, 0.3) + (600.0 if i >= 1000 else 0.0) for i in range(2000)]
    scores = score_series(ts, vs)
    assert scores[1000] >= 0.9
    assert max(scores[1100:]) < 0.5


def test_explanation_names_expected_band_and_observed() -> None:
    det = StreamingDetector()
    for i in range(200):
        det.update(1.7e9 + 60 * i, 100.0 + (i % 3))
    score = det.update(1.7e9 + 60 * 200, 160.0)
    e = det.explain()
    assert score > 0.9 and e["observed"] == 160.0
    assert e["lower"] < e["expected"] < e["upper"] < 160.0
    assert "expected" in det.describe()


def test_non_finite_values_are_ignored_and_gaps_work() -> None:
    det = StreamingDetector()
    for i in range(100):
        det.update(1.7e9 + 60 * i, 5.0 + (i % 2) * 0.1)
    n = det.n
    assert det.update(1.7e9 + 6060, math.nan) == 0.0 and det.n == n
    # A gap of three days, then normal values: no alarm.
    assert det.update(1.7e9 + 3 * 86400, 5.05) < 0.5


def test_index_timestamps_are_read_as_hours() -> None:
    det = StreamingDetector()
    for i in range(1, 100):
        det.update(i, 1.0 + 0.01 * (i % 5))
    assert det.index_clock and det.width == 3600.0


def test_state_from_a_bad_document_is_a_clear_error() -> None:
    for bad in ({}, {"version": 99}):
        try:
            StreamingDetector.from_dict(bad)
        except ValueError as e:
            assert "version" in str(e)
        else:
            raise AssertionError("accepted a bad state")


def test_scenario_files_match_the_generator() -> None:
    for s in scenarios.all_scenarios():
        stored = scenarios.read_csv(SCENARIO_DIR / f"{s.name}.csv")
        assert stored.windows == [w for w in _merge(s.windows)]
        assert len(stored.values) == len(s.values)
        assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(stored.values, s.values))


def _merge(windows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def test_labeled_scenarios_window_score() -> None:
    """Standard window score on the scenario files (0 = never alarming, 100 = perfect), and no page at
    all on the normal seasonal series; the event-level view keeps precision high at 0.5."""
    corpus = []
    detected = false_positives = 0
    for path in sorted(SCENARIO_DIR.glob("*.csv")):
        s = scenarios.read_csv(path)
        scores = score_series(s.timestamps, s.values)
        e = evaluate(scores, s.timestamps, s.windows, 0.5, int(0.15 * len(scores)))
        detected += e.detected
        false_positives += e.false_positives
        if not s.windows:                       # normal seasonal data: no page at all
            assert e.false_positives == 0, path.name
        corpus.append((path.stem, scores, s.windows))
    assert window_score(corpus).score >= 75
    assert detected / (detected + false_positives) >= 0.8
