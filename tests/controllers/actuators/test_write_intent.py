"""A kill between the load balancer write and the history entry must not lose the change from the audit trail.

The actuator wrote the weights, then appended its history entry, then audited. Killed in between, the restart
re-applied the controller's re-sent version as "weights already live, nothing written": audited with before =
after, the change that really happened (and its before) in no record. Now a write-ahead intent (before, after,
the entry; fsynced before the write) is resolved by the restart: audited with the real before/after and its
entry recorded (the re-sent version is then a noop), or audited ``failed`` when the write never landed.
The kill is a BaseException raised in the target's write (nothing after it runs, as under SIGKILL).
"""

from __future__ import annotations

import time
from pathlib import Path

from opsloop.audit.trail import AuditLog
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.store import WeightStore
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import ListSink, decision, haproxy_actuator
from tests.controllers.actuators.test_rollback_epochs import MemoryLB


class Killed(BaseException):
    """The process died: no except clause of the actuator runs."""


def kill_after_write(act: EdgeActuator) -> None:
    write = act.target.write

    def written_then_killed(weights: dict[str, int]) -> None:
        write(weights)
        raise Killed()

    act.target.write = written_then_killed   # type: ignore[method-assign]


def kill_before_write(act: EdgeActuator) -> None:
    def killed(weights: dict[str, int]) -> None:
        raise Killed()

    act.target.write = killed   # type: ignore[method-assign]


def apply_killed(act: EdgeActuator, d: EdgeWeights) -> None:
    try:
        act.apply(d)
    except Killed:
        return
    raise AssertionError("the write was not reached")


def test_a_kill_between_the_haproxy_write_and_the_record_is_audited_after_the_restart(lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    store_dir = tmp_path / "weights"
    first, _ = haproxy_actuator(lab_edge, store_dir)
    before = first.read()
    d = decision(1, {"near": 0.25, "far": 0.75})
    kill_after_write(first)
    apply_killed(first, d)
    written = first.read()
    assert written != before   # HAProxy holds the new weights; no history entry, no audit record
    assert first.store.history() == []

    restarted, sink = haproxy_actuator(lab_edge, store_dir)
    res = restarted.apply(d)   # the controller re-sends its version
    changes = [(r.version, r.before, r.after) for r in sink.records if r.before is not None and r.before != r.after]
    assert changes == [(1, before, written)], [(r.result, r.before, r.after, r.reason) for r in sink.records]
    recovered = sink.records[0]
    assert recovered.result == "applied" and "recovered after a restart" in recovered.reason, recovered.reason
    assert res.result == "noop", res   # its entry is recorded: the re-sent version is what is live
    assert [(e.version, e.weights) for e in restarted.store.history()] == [(1, written)]
    assert not restarted.store.intent_path.exists()


def test_a_kill_before_the_write_landed_is_audited_failed_and_the_decision_then_applies(tmp_path: Path) -> None:
    lb = MemoryLB()
    first = EdgeActuator(lb, "ams1", "web", WeightStore(tmp_path, "ams1", "web"), AuditLog([ListSink()]),
                         max_step=1.0)
    d = EdgeWeights(version=4, epoch=int(time.time() * 1000) - 60_000, listener="web", edge="ams1",
                    weights={"near": 0.25, "far": 0.75}, computed_at=time.time())
    kill_before_write(first)
    apply_killed(first, d)
    del lb.write   # the restarted process writes for real
    sink = ListSink()
    restarted = EdgeActuator(lb, "ams1", "web", WeightStore(tmp_path, "ams1", "web"), AuditLog([sink]),
                             max_step=1.0)
    assert restarted.apply(d).result == "applied"
    assert [(r.result, r.before, r.after) for r in sink.records] == [
        ("failed", {"near": 128, "far": 128}, {"near": 128, "far": 128}),
        ("applied", {"near": 128, "far": 128}, {"near": 64, "far": 192})]
    assert "interrupted" in sink.records[0].reason
    assert [e.version for e in restarted.store.history()] == [4]
