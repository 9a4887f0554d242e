"""The detector on operational series: short periods, log space for skewed series, routine spikes, slope
changes, state across every buffer the detector keeps, and the operational corpus itself."""

from __future__ import annotations

import json
import math
import random

import pytest

from opsloop.streams.detectors.anomaly.model import NEW_IN_V3, DetectorConfig, StreamingDetector, score_series
from opsloop.streams.detectors.ops_corpus import KINDS, NORMAL, REPORT_SEEDS, TUNE_SEEDS, ops_corpus

T0 = 1_704_067_200.0


def _alarms(scores: list[float], start: int = 0) -> list[int]:
    return [i for i, s in enumerate(scores) if s >= 0.5 and i >= start]


def _periodic(n: int, period: int, seed: int = 5) -> list[float]:
    rng = random.Random(seed)
    return [50.0 + 6.0 * math.sin(2 * math.pi * i / period) + rng.gauss(0, 0.4) for i in range(n)]


def test_a_short_period_is_found_and_a_missing_cycle_alarms() -> None:
    vs = _periodic(3000, 24)
    ts = [T0 + 300 * i for i in range(3000)]
    det = StreamingDetector()
    clean = [det.update(t, v) for t, v in zip(ts, vs)]
    assert det.period == 24 and det.explain()["model"] == "periodic"
    assert _alarms(clean, 500) == []                       # a clean cycle is not news
    broken = list(vs)
    for i in range(2000, 2024):                            # one cycle does not happen
        broken[i] = 50.0 + broken[i] - vs[i] + 6.0 * math.sin(2 * math.pi * 2000 / 24)
    hits = _alarms(score_series(ts, broken), 500)
    assert len(hits) == 1 and 2000 <= hits[0] < 2024


def test_amplitude_change_of_a_short_period_alarms_once() -> None:
    vs = _periodic(3000, 48, seed=8)
    vs[2000:2144] = [50.0 + 2.5 * (v - 50.0) for v in vs[2000:2144]]
    hits = _alarms(score_series([T0 + 60 * i for i in range(3000)], vs), 500)
    assert len(hits) == 1 and 2000 <= hits[0] < 2048


def test_no_period_in_a_random_walk_or_noise() -> None:
    rng = random.Random(2)
    walk, x = [], 0.0
    for _ in range(1000):
        x += rng.gauss(0, 1)
        walk.append(x)
    for vs in (walk, [rng.gauss(0, 1) for _ in range(1000)]):
        det = StreamingDetector()
        for i, v in enumerate(vs):
            det.update(T0 + 60 * i, v)
        assert det.period == -1


def test_skewed_positive_series_is_modelled_in_log_space_and_explained_in_its_units() -> None:
    rng = random.Random(4)
    vs = [200.0 * math.exp(rng.gauss(0, 0.6)) for _ in range(2000)]
    vs[1500] = 200.0 * 60                                  # a 60x burst
    det = StreamingDetector()
    scores = [det.update(T0 + 60 * i, v) for i, v in enumerate(vs[:1501])]
    assert det.log_mode == 1
    e = det.explain()
    assert e["observed"] == pytest.approx(vs[1500]) and e["model"].endswith("(log)")
    assert e["lower"] < e["expected"] < e["upper"] < vs[1500]
    assert scores[1500] >= 0.5
    flat = StreamingDetector()
    for i in range(200):
        flat.update(T0 + 60 * i, 248.0)
    assert flat.log_mode == -1                             # the lab's flat watts stay as they are


def test_routine_bursts_stop_paging_but_a_new_kind_of_excursion_pages() -> None:
    """CPU with a short burst every ~150 rows: after a few the bursts are routine; a drop is not."""
    rng = random.Random(6)
    vs = [20.0 + rng.gauss(0, 1.0) for _ in range(4000)]
    for i in range(100, 4000, 150):
        vs[i] += rng.uniform(15.0, 30.0)
    vs[3500:3560] = [2.0 + rng.gauss(0, 0.3) for _ in range(60)]
    scores = score_series([T0 + 300 * i for i in range(4000)], vs)
    late = _alarms(scores, 1500)
    assert [i for i in late if i >= 3500][:1] == [3500]
    # Thirteen bursts after row 1500: only the few near the largest seen still reach 0.5.
    assert len([i for i in late if i < 3500]) <= 3
    plain = score_series([T0 + 300 * i for i in range(4000)], vs, DetectorConfig(spike_share=0.0))
    assert len([i for i in _alarms(plain, 1500) if i < 3500]) > 6


def test_a_trend_that_speeds_up_scores_above_everything_before() -> None:
    """A fill that runs ten times faster: no value is far from the fast level, the steps show it (the
    score stays below the paging level of 0.5 here; a backtest's threshold finds it)."""
    rng = random.Random(7)
    vs, x = [], 30.0
    for i in range(4000):
        x += 0.004 if i < 3000 else 0.04
        vs.append(x + rng.gauss(0, 0.15))
    ts = [T0 + 300 * i for i in range(4000)]
    scores = score_series(ts, vs)
    assert max(scores[3000:3300]) > max(scores[600:3000]) + 0.05


@pytest.mark.parametrize("cut", [50, 99, 101, 300, 429, 431, 1200])
def test_state_round_trip_in_every_buffer(cut: int) -> None:
    """Restart while the log-space rows or the period rows are still buffered, and after both."""
    series = [s for s in ops_corpus(TUNE_SEEDS[:1], n=1500) if s.name.split("/")[-1] in ("periodic", "latency")]
    for s in series:
        whole = score_series(s.timestamps, s.values)
        det = StreamingDetector()
        for t, v in zip(s.timestamps[:cut], s.values[:cut]):
            det.update(t, v)
        back = StreamingDetector.from_dict(json.loads(json.dumps(det.to_dict(), allow_nan=False)))
        assert [back.update(t, v) for t, v in zip(s.timestamps[cut:], s.values[cut:])] == whole[cut:]


def test_state_of_version_2_loads() -> None:
    det = StreamingDetector(DetectorConfig(warmup_points=5))
    for i in range(50):
        det.update(T0 + 60 * i, 10.0 + (i % 3))
    doc = det.to_dict()
    doc["version"] = 2
    for name in NEW_IN_V3:
        doc.pop(name)
    restored = StreamingDetector.from_dict(doc)
    assert restored.update(T0 + 60 * 50, 500.0) >= 0.9


def test_operational_corpus_is_fixed_and_its_halves_are_disjoint() -> None:
    assert not set(TUNE_SEEDS) & set(REPORT_SEEDS)
    a, b = ops_corpus(REPORT_SEEDS[:1], n=800), ops_corpus(REPORT_SEEDS[:1], n=800)
    assert [s.values for s in a] == [s.values for s in b]
    assert len(a) == len(KINDS) + len(NORMAL)
    for s in a:
        assert len(s.timestamps) == len(s.values)
        assert all(t2 > t1 for t1, t2 in zip(s.timestamps, s.timestamps[1:]))
        assert bool(s.windows) == (not s.name.endswith("-normal"))
        for lo, hi in s.windows:       # 10 % of the series over its events, after the probation
            assert 0.1 * len(s.values) < hi and hi - lo + 1 <= 0.1 * len(s.values) + 1


@pytest.mark.parametrize("series", ops_corpus(REPORT_SEEDS[:1], n=1500), ids=lambda s: s.name)
def test_prefix_gives_identical_scores_on_operational_series(series) -> None:
    whole = score_series(series.timestamps, series.values)
    cut = len(series.values) * 2 // 3
    assert score_series(series.timestamps[:cut], series.values[:cut]) == whole[:cut]
