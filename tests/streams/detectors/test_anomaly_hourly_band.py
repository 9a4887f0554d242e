"""A night outage in a daily requests series pages: the level model's band follows the load.

On a requests series (5-minute samples, a daily curve, noise growing with the load) the level model with
its damped trend predicts the curve as well as the seasonal model, so it is the one that scores. Its scale
was one moving average over ~50 points, so at night it still carried the afternoon's noise: an outage to
x0.15-0.25 of the night's load (or an early-morning surge of x2.5) was z 3-4 and scored 0.1-0.3 (no
page). The level model now scores against
the scale of its residual at that hour of the day (shrunk towards the global scale while the hour has been
seen on fewer than two days), so the same outage is far outside the night's band.

The cases are the operational corpus' own requests series (streams/detectors/ops_corpus.py), seeds outside
both its tuning and its reporting halves.
"""

from __future__ import annotations

import json
import random

import pytest

from opsloop.streams.detectors import ops_corpus as oc
from opsloop.streams.detectors.anomaly.model import HOURS, StreamingDetector, score_series
from opsloop.streams.detectors.evaluate_windows import windows_around_events
from opsloop.streams.detectors.state_check import StateError


def _requests(seed: int, anom: bool = True) -> tuple[list[float], list[float], list[int]]:
    """One requests series of the operational corpus, as its generator builds it (seed outside its halves)."""
    rng = random.Random(seed * 10_000 + 1)
    length = int(4000 * rng.uniform(0.6, 1.0))
    xs, ev = oc._requests(rng, length, anom)
    return oc._artefacts(rng, xs, ev)


# seed: (row of the event, hour of the day, factor): each scored 0.09-0.27 before (two outages, a surge)
NIGHT_EVENTS = {15: (1738, 0.9, 0.15), 26: (2032, 1.4, 0.23), 1: (1918, 4.8, 2.51)}


@pytest.mark.parametrize("seed", sorted(NIGHT_EVENTS))
def test_night_event_in_a_daily_requests_series_pages(seed: int) -> None:
    ts, xs, ev = _requests(seed)
    e, hour, factor = NIGHT_EVENTS[seed]
    assert e in ev and round((ts[e] - oc.T0) / 3600 % 24, 1) == hour and round(xs[e] / xs[e - 1], 2) == factor
    scores = score_series(ts, xs)
    windows = windows_around_events(len(xs), ev)
    a, b = windows[ev.index(e)]
    assert max(scores[a:b + 1]) >= 0.5, f"night event scored {max(scores[a:b + 1]):.2f}"
    assert [i for i, s in enumerate(scores) if s >= 0.5 and not any(a <= i <= b for a, b in windows)] == []


@pytest.mark.parametrize("seed", sorted(NIGHT_EVENTS))
def test_the_same_series_without_the_outage_does_not_page(seed: int) -> None:
    ts, xs, _ = _requests(seed, anom=False)
    assert max(score_series(ts, xs)) < 0.5


def test_hourly_band_state_restores_exactly_and_an_older_state_without_it_loads() -> None:
    ts, xs, _ = _requests(26)
    cut = 2000                                   # a week in: every hour learnt
    det = StreamingDetector()
    for t, v in zip(ts[:cut], xs[:cut]):
        det.update(t, v)
    doc = json.loads(json.dumps(det.to_dict()))
    assert len(doc["h_s0"]) == len(doc["h_c0"]) == HOURS and min(doc["h_c0"]) > 0
    resumed = StreamingDetector.from_dict(doc)
    assert [resumed.update(t, v) for t, v in zip(ts[cut:], xs[cut:])] == \
        [det.update(t, v) for t, v in zip(ts[cut:], xs[cut:])]
    # a state saved by the code before the hourly band (same version, no h_s0/h_c0): loads, learns it anew
    old = {k: v for k, v in doc.items() if k not in ("h_s0", "h_c0")}
    older = StreamingDetector.from_dict(old)
    assert older.h_s0 == [0.0] * HOURS and older.h_c0 == [0] * HOURS
    assert all(0.0 <= older.update(t, v) <= 1.0 for t, v in zip(ts[cut:], xs[cut:]))
    assert min(older.h_c0) > 0


@pytest.mark.parametrize("name, bad", [("h_s0", [1.0] * 5), ("h_c0", [1] * 25), ("h_s0", [-1.0] * HOURS),
                                       ("h_c0", ["x"] * HOURS)])
def test_damaged_hourly_band_is_refused(name: str, bad: list) -> None:
    ts, xs, _ = _requests(26)
    det = StreamingDetector()
    for t, v in zip(ts[:400], xs[:400]):
        det.update(t, v)
    doc = json.loads(json.dumps(det.to_dict()))
    doc[name] = bad
    with pytest.raises(StateError, match=name):
        StreamingDetector.from_dict(doc)
