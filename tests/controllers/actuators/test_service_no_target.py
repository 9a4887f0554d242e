"""A decision for a listener of our edge that has no target: it goes nowhere. It was logged on every record
(a controller re-sends each tick: a line a second per listener, for good) and counted nowhere (no alert could
say a controller's decisions are not carried out). Now counted (``errors_total{kind="no_target"}``, alerted by
EdgeWeightActuatorErrors) and logged once a minute per listener."""

from __future__ import annotations

import time
from pathlib import Path

from opsloop.controllers.actuators import metrics
from opsloop.records import EdgeWeights
from tests.controllers.actuators.test_applier import _service
from tests.helpers import captured_logs


def test_decisions_without_a_target_are_counted_and_logged_once_a_minute(tmp_path: Path) -> None:
    svc, target, sent, sink, edge = _service(tmp_path)
    d = EdgeWeights(version=1, listener="nobody", edge=edge, weights={"a": 0.5, "b": 0.5}, computed_at=time.time())
    counted = metrics.ERRORS.labels(edge, "no_target")._value.get()
    with captured_logs() as logs:
        for _ in range(5):
            assert svc.handle_records([(f"nobody|{edge}".encode(), d.encode())]) == 0
    assert metrics.ERRORS.labels(edge, "no_target")._value.get() - counted == 5
    said = [line for line in logs.lines if "decision_without_target" in line]
    assert len(said) == 1 and "nobody" in said[0], said
    assert sink.records == [] and target.writes == []
