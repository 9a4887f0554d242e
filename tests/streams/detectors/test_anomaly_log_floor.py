"""The anomaly detector's log-space floor (``lo``) is never 0.0: a right-skewed first window whose minimum
is subnormal (5e-324) made ``0.5 * min`` underflow to 0.0, and every later reading <= 0 raised
``math domain error`` in ``log`` — for good, since the state is persisted."""

from __future__ import annotations

import random

from opsloop.streams.detectors.anomaly.model import MIN_LOG_FLOOR, StreamingDetector

T0 = 1_795_000_000.0


def _subnormal_window() -> list[float]:
    # right-skewed in its own units (a few 1.0 among ~0), symmetric in log space: modelled in logs
    xs = [5e-324] * 20 + [4e-162] * 60 + [1.0] * 20
    random.Random(1).shuffle(xs)
    return xs


def _warmed() -> StreamingDetector:
    det = StreamingDetector()
    for i, v in enumerate(_subnormal_window()):
        det.update(T0 + 10 * i, v)
    return det


def test_a_subnormal_minimum_gives_a_positive_floor_and_later_zeros_score() -> None:
    det = _warmed()
    assert det.log_mode == 1 and det.lo >= MIN_LOG_FLOOR > 0.0
    for j, v in enumerate([3.0, 0.0, 5.0, 0.0, -2.0]):
        score = det.update(T0 + 2000 + 10 * j, v)   # raised ValueError for 0.0 and -2.0
        assert 0.0 <= score <= 1.0


def test_a_state_saved_with_a_zero_floor_is_repaired_on_restore() -> None:
    doc = _warmed().to_dict()
    doc["lo"] = 0.0   # what the old code persisted
    det = StreamingDetector.from_dict(doc)
    assert det.lo == MIN_LOG_FLOOR
    assert 0.0 <= det.update(T0 + 5000, 0.0) <= 1.0


def test_an_ordinary_minimum_keeps_half_of_it_as_the_floor() -> None:
    rng = random.Random(7)
    det = StreamingDetector()
    xs = [rng.lognormvariate(3.0, 1.0) for _ in range(100)]
    for i, v in enumerate(xs):
        det.update(T0 + 10 * i, v)
    assert det.log_mode == 1 and det.lo == 0.5 * min(xs)
