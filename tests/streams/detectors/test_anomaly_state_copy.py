"""A detector restored from a state dict owns its state: feeding it points leaves the dict as it was.

Before, ``StreamingDetector.from_dict`` kept the dict's lists (and the value histogram) as its own, so
learning wrote through into the dict it came from (the table's in-memory value): a second restore from
that dict started from a later state than the one written, and a dict compared before/after a batch
showed no change. ``to_dict`` kept the histogram the same way: a state taken, then the detector fed,
was no longer the state taken."""

from __future__ import annotations

import copy
import math
import random

import orjson

from opsloop.records import metric
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.model import DetectorConfig, StreamingDetector
from opsloop.streams.detectors.anomaly.settings import AnomalySettings

T0 = 1_790_000_000.0


def _points(n: int, start: int = 0, seed: int = 1) -> list[tuple[float, float]]:
    """A daily-seasonal, slightly skewed series with a short period: every part of the state is in use."""
    rng = random.Random(seed)
    return [(T0 + 300.0 * i, 200.0 + 40.0 * math.sin(2 * math.pi * i / 288) + 15.0 * (i % 17 == 0)
             + rng.lognormvariate(0.0, 0.4)) for i in range(start, start + n)]


def _warmed(n: int = 700) -> StreamingDetector:
    det = StreamingDetector(DetectorConfig())
    for t, v in _points(n):
        det.update(t, v)
    return det


def _stored(det: StreamingDetector) -> dict:
    """The state as a table holds it in memory after reading it back (a fresh JSON-decoded dict)."""
    return orjson.loads(orjson.dumps(det.to_dict()))


def _mutable_parts(doc: dict) -> list[str]:
    return [k for k, v in doc.items() if isinstance(v, (list, dict)) and k != "config"]


def test_a_restored_detector_leaves_the_dict_it_came_from_unchanged() -> None:
    for n in (10, 150, 700):   # in warm-up (steps, log buffer), period buffer, all parts learned
        doc = _stored(_warmed(n))
        before = copy.deepcopy(doc)
        det = StreamingDetector.from_dict(doc)
        for t, v in _points(300, start=n, seed=2):
            det.update(t, v)
        assert doc == before, f"after {n} points: fields changed in the source dict: " + ", ".join(
            k for k in _mutable_parts(doc) if doc[k] != before[k])


def test_two_restores_from_one_dict_score_alike() -> None:
    doc = _stored(_warmed())
    first, second = StreamingDetector.from_dict(doc), StreamingDetector.from_dict(doc)
    more = _points(400, start=700, seed=3)
    a = [first.update(t, v) for t, v in more]
    b = [second.update(t, v) for t, v in more]
    assert a == b
    assert first.to_dict() == second.to_dict()


def test_a_state_taken_stays_as_taken_while_the_detector_goes_on() -> None:
    det = _warmed()
    taken = det.to_dict()
    before = copy.deepcopy(taken)
    for t, v in _points(300, start=700, seed=4):
        det.update(t, v)
    assert taken == before, "changed: " + ", ".join(k for k in _mutable_parts(taken) if taken[k] != before[k])


def test_the_handler_restored_from_table_values_does_not_write_into_them() -> None:
    settings = AnomalySettings.model_validate({"series": [{"metric": "ipmi_power", "field": "watts"}]})
    h = AnomalyHandler(settings)
    for t, v in _points(700):
        h.handle([metric("ipmi_power", {"watts": v}, {"host": "a"}, t)], t)
    (key,) = h.series
    table = {key: orjson.loads(orjson.dumps(h.state_of(key)))}
    before = copy.deepcopy(table)
    fresh = AnomalyHandler(settings)
    fresh.restore(table)
    for t, v in _points(200, start=700, seed=5):
        fresh.handle([metric("ipmi_power", {"watts": v}, {"host": "a"}, t)], t)
    assert table == before
