"""The actuator service's timers are elapsed times on the monotonic clock: a wall-clock step of an hour
(NTP correcting the host, a wrong RTC fixed by hand) neither makes every slot fail static at once nor keeps a
slot fresh for an hour, nor postpones a retry for an hour. Driven through ``step()`` (the run loop's own
call) with both clocks patched; a decision's computed_at stays wall clock (event time, another host's date).
Before: freshness, back-off and reconcile were measured on time.time()."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from opsloop.controllers.actuators import metrics
from tests.controllers.actuators.support import decision
from tests.controllers.actuators.test_applier import _service

HOUR = 3600.0
REAL_TIME = time.time


class Clocks:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall_step = 0.0
        self.mono = 1000.0
        monkeypatch.setattr(time, "time", lambda: REAL_TIME() + self.wall_step)
        monkeypatch.setattr(time, "monotonic", lambda: self.mono)


class Rec:
    """A consumer record's fields the actuator reads."""

    def __init__(self, key: bytes, value: bytes, partition: int = 0, offset: int = 0) -> None:
        self.key, self.value, self.partition, self.offset = key, value, partition, offset


class Consumer:
    def __init__(self) -> None:
        self.queue: list[Rec] = []

    def poll(self, timeout_ms: int = 0) -> dict[str, list[Rec]]:
        recs, self.queue = self.queue, []
        return {"tp": recs} if recs else {}

    def assignment(self) -> set[Any]:
        return set()

    def commit(self, timeout_ms: int | None = None) -> None:
        pass


def _started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any, Consumer, Clocks, str]:
    clocks = Clocks(monkeypatch)
    svc, target, sent, sink, edge = _service(tmp_path, stale_after_s=10.0)
    consumer = svc._consumer = Consumer()
    consumer.queue.append(Rec(f"l|{edge}".encode(), decision(1, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=edge,
                                                              listener="l").encode()))
    svc.step()
    assert sink.results == ["applied"]
    return svc, target, sink, consumer, clocks, edge


def _fail_static(edge: str) -> float:
    return metrics.FAIL_STATIC.labels("l", edge)._value.get()


def test_the_wall_clock_an_hour_ahead_does_not_make_a_fresh_slot_fail_static(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    svc, target, sink, consumer, clocks, edge = _started(tmp_path, monkeypatch)
    clocks.wall_step, clocks.mono = HOUR, clocks.mono + 2
    svc.step()
    assert _fail_static(edge) == 0 and sink.results == ["applied"]


def test_the_wall_clock_an_hour_behind_does_not_keep_a_stale_slot_fresh(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    svc, target, sink, consumer, clocks, edge = _started(tmp_path, monkeypatch)
    clocks.wall_step, clocks.mono = -HOUR, clocks.mono + 11   # 11 s without a decision, stale_after_s 10
    svc.step()
    assert _fail_static(edge) == 1 and sink.results == ["applied", "held"]


def test_a_retry_is_not_postponed_by_the_wall_clock_going_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, target, sink, consumer, clocks, edge = _started(tmp_path, monkeypatch)
    target.gone = True
    consumer.queue.append(Rec(f"l|{edge}".encode(), decision(2, {"a": 0.4, "b": 0.3, "c": 0.3}, edge=edge,
                                                              listener="l").encode()))
    svc.step()
    assert sink.results[-1] == "failed"                         # back-off 1 s
    target.gone = False
    clocks.wall_step, clocks.mono = -HOUR, clocks.mono + 1.5
    svc.step()
    assert sink.results[-1] == "applied" and svc.slots[("l", edge)].pending is None


def test_a_decision_computed_an_hour_ago_by_the_wall_clock_is_still_held(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # computed_at is event time: compared with the wall clock, which stays right for it
    svc, target, sink, consumer, clocks, edge = _started(tmp_path, monkeypatch)
    consumer.queue.append(Rec(f"l|{edge}".encode(), decision(2, {"a": 0.4, "b": 0.3, "c": 0.3}, edge=edge,
                                                              listener="l", age_s=HOUR).encode()))
    svc.step()
    assert sink.results[-1] == "held" and _fail_static(edge) == 1


def test_each_step_marks_its_poll_so_a_hung_run_loop_is_alerted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics answers from its own thread: a hung run loop still scrapes, with every gauge at its last value.
    EdgeWeightActuatorStuck reads the poll time each step sets (wall clock: Prometheus compares it with time())."""
    svc, *_ = _started(tmp_path, monkeypatch)
    first = metrics.LAST_POLL._value.get()
    assert abs(first - time.time()) < HOUR   # the step's own wall clock, not 0
    monkeypatch.setattr(time, "time", lambda: first + 30.0)
    svc.step()
    assert metrics.LAST_POLL._value.get() == first + 30.0
