"""An epoch far in the future must not fence the slot for good.

A decision's ``epoch`` is its controller's start time in ms; the actuator refuses a decision whose
``(epoch, version)`` is below the highest applied. A valid record with an epoch a year ahead (a controller started
with its clock a year ahead, a hand-made record) was applied and then every real decision was ``stale_version``,
for good: nothing a controller could start with outranks it. Now such a decision is refused (audited, counted,
in a row, dead-lettered by the service) and never becomes the version in force; an entry of that kind already in
the history (written by the old code) orders nothing after a restart (logged once, counted, kept for the audit).
A controller whose clock is a few seconds ahead still applies, and two controllers are still fenced by epoch.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from opsloop.audit.trail import AuditLog
from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.actuators.store import WeightStore
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_rollback_epochs import MemoryLB
from tests.helpers import captured_logs, unique

YEAR_MS = 365 * 86_400_000


def now_ms() -> int:
    return int(time.time() * 1000)


def decide(epoch: int, version: int, near: float, edge: str = "ams1", listener: str = "web") -> EdgeWeights:
    return EdgeWeights(version=version, epoch=epoch, listener=listener, edge=edge,
                       weights={"near": near, "far": round(1 - near, 6)}, computed_at=time.time())


def actuator(tmp_path: Path, edge: str = "ams1") -> tuple[EdgeActuator, MemoryLB, ListSink]:
    lb, sink = MemoryLB(), ListSink()
    act = EdgeActuator(lb, edge, "web", WeightStore(tmp_path, edge, "web"), AuditLog([sink]), max_step=1.0)
    return act, lb, sink


def errors(edge: str, kind: str) -> float:
    return metrics.ERRORS.labels(edge, kind)._value.get()


def test_a_decision_with_an_epoch_a_year_ahead_is_refused_and_fences_nothing(tmp_path: Path) -> None:
    act, lb, sink = actuator(tmp_path)
    res = act.apply(decide(now_ms() + YEAR_MS, 3, 0.9))
    assert res.result == "refused" and "in the future" in res.reason and "max_clock_skew_s" in res.reason, res
    assert lb.weights == {"near": 128, "far": 128} and act.store.history() == []
    assert sink.records[-1].result == "refused"
    # the controller really running (started an hour ago) applies, and keeps applying
    assert act.apply(decide(now_ms() - 3_600_000, 1, 0.25)).result == "applied"
    assert act.apply(decide(now_ms() - 3_600_000, 2, 0.5)).result == "applied"
    assert lb.weights == {"near": 128, "far": 128} and [e.version for e in act.store.history()] == [1, 2]


def test_a_year_ahead_entry_in_the_history_does_not_fence_after_a_restart(tmp_path: Path) -> None:
    """History written by the old code: the entry stays (audit), one line and one count say it orders nothing."""
    edge = unique("ahead")
    store = WeightStore(tmp_path, edge, "web")
    store.path.parent.mkdir(parents=True)
    applied_at = time.time() - 600
    bad = {"version": 3, "epoch": int(applied_at * 1000) + YEAR_MS, "weights": {"near": 230, "far": 26},
           "shares": {"near": 0.9, "far": 0.1}, "decision": {"near": 0.9, "far": 0.1}, "applied_at": applied_at}
    store.path.write_bytes(orjson.dumps(bad) + b"\n")
    act, lb, sink = actuator(tmp_path, edge)
    counted = errors(edge, "epoch_ahead")
    with captured_logs() as logs:
        assert act.apply(decide(now_ms() - 3_600_000, 1, 0.25, edge)).result == "applied"
        assert act.apply(decide(now_ms() - 3_600_000, 2, 0.5, edge)).result == "applied"
    assert lb.weights == {"near": 128, "far": 128}
    assert [(e.epoch, e.version) for e in act.store.history()][0] == (bad["epoch"], 3)   # kept for the audit
    said = [line for line in logs.lines if "history_epoch_ahead_ignored" in line]
    assert len(said) == 1 and str(store.path) in said[0], said
    assert errors(edge, "epoch_ahead") - counted == 1


def test_a_clock_a_few_seconds_ahead_still_applies_and_two_controllers_are_still_fenced(tmp_path: Path) -> None:
    act, lb, sink = actuator(tmp_path)
    newer = now_ms() + 3_000                    # a controller whose clock runs 3 s ahead: within max_clock_skew_s 5
    assert act.apply(decide(newer, 1, 0.25)).result == "applied"
    older = now_ms() - 3_600_000                # the instance a failover left running
    res = act.apply(decide(older, 9, 0.75))
    assert res.result == "stale_version", res
    assert act.apply(decide(newer, 2, 0.5)).result == "applied"
    assert lb.weights == {"near": 128, "far": 128}


def test_the_service_refuses_it_on_arrival_so_the_real_decision_of_the_poll_applies(tmp_path: Path) -> None:
    """In one poll the year-ahead decision's higher stamp won the slot: the real controller's decision was dropped
    (and called fenced) and the refused one left nothing applied, every poll both came in."""
    edge = unique("svc")
    cfg = ActuatorConfig(stale_after_s=10.0, store_dir=tmp_path, backoff_initial_s=1.0, backoff_max_s=4.0,
                         targets=[{"edge": edge, "listener": "web", "kind": "haproxy",
                                   "socket": str(tmp_path / "none.sock"), "backend": "be",
                                   "servers": {"near": "near", "far": "far"}}])
    sent: list = []

    class Producer:
        def send(self, topic, key=None, value=None, **kw):
            sent.append((topic, key, value))

    sink = ListSink()
    svc = ActuatorService(cfg, "127.0.0.1:1", [edge], AuditLog([sink]), consumer=object(), producer=Producer())
    lb = MemoryLB()
    slot = svc.slots[("web", edge)]
    slot.actuator.target = lb
    key = f"web|{edge}".encode()
    real, far = decide(now_ms() - 60_000, 5, 0.25, edge), decide(now_ms() + YEAR_MS, 1, 0.9, edge)
    svc.handle_records([(key, real.encode()), (key, far.encode())], [(0, 10), (0, 11)])
    svc.tick(time.monotonic())
    assert lb.weights == {"near": 64, "far": 192}
    assert [(r.version, r.result) for r in sink.records if r.action == "edge.weights.apply"] == \
        [(1, "refused"), (5, "applied")]
    dead = [orjson.loads(v) for topic, _, v in sent if "deadletter" in topic]
    assert [d["offset"] for d in dead] == [11] and "in the future" in dead[0]["reason"], dead
    assert metrics.FENCED_WRITER.labels(edge, "web")._value.get() == 0
