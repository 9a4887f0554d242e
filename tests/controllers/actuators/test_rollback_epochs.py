"""Rollback across a controller restart that took a new epoch and started its versions again.

Decisions are ordered by ``(epoch, version)``; rollback picked "the previous version" by the version
number alone, so after a restart at version 1 (history lost, the case epochs exist for) the weights
that were live just before it were "no version older than 1" and the operator could not roll back.
The target is an in-memory load balancer: the fault is in the choice of the entry.
"""

from __future__ import annotations

import time
from pathlib import Path

from opsloop.audit.trail import AuditLog
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.store import WeightStore
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import ListSink

OLD_EPOCH, NEW_EPOCH = 1_795_000_000_000, 1_795_000_600_000


class MemoryLB:
    kind = "haproxy"
    max_weight = 256

    def __init__(self) -> None:
        self.weights = {"near": 128, "far": 128}

    @property
    def origins(self) -> list[str]:
        return ["near", "far"]

    def describe(self) -> str:
        return "memory:ams1/web"

    def read(self) -> dict[str, int]:
        return dict(self.weights)

    def write(self, weights: dict[str, int]) -> None:
        self.weights.update(weights)

    def down(self) -> set[str]:
        return set()

    def left_alone(self) -> dict[str, str]:
        return {}


def decide(epoch: int, version: int, near: float) -> EdgeWeights:
    return EdgeWeights(version=version, epoch=epoch, listener="web", edge="ams1",
                       weights={"near": near, "far": round(1 - near, 6)}, computed_at=time.time())


def actuator(tmp_path: Path) -> tuple[EdgeActuator, MemoryLB]:
    lb = MemoryLB()
    act = EdgeActuator(lb, "ams1", "web", WeightStore(tmp_path, "ams1", "web"), AuditLog([ListSink()]),
                       max_step=1.0)
    return act, lb


def test_rollback_after_a_restart_at_version_1_restores_the_weights_live_before_it(tmp_path: Path) -> None:
    act, lb = actuator(tmp_path)
    assert act.apply(decide(OLD_EPOCH, 40, 0.25)).result == "applied"
    assert act.apply(decide(OLD_EPOCH, 41, 0.5)).result == "applied"
    live_before_restart = lb.read()
    assert act.apply(decide(NEW_EPOCH, 1, 0.75)).result == "applied"   # restarted controller, new epoch
    res = act.rollback()
    assert res.result == "rolled_back", res.reason
    assert lb.read() == live_before_restart and res.version == 41


def test_rollbacks_in_a_row_walk_back_through_both_epochs(tmp_path: Path) -> None:
    act, lb = actuator(tmp_path)
    for epoch, version, near in ((OLD_EPOCH, 40, 0.25), (OLD_EPOCH, 41, 0.5), (NEW_EPOCH, 1, 0.75),
                                 (NEW_EPOCH, 2, 1.0)):
        assert act.apply(decide(epoch, version, near)).result == "applied"
    assert [act.rollback().version for _ in range(3)] == [1, 41, 40]
    assert lb.read()["near"] == 64          # 0.25 of 256
    assert act.rollback().result == "refused"   # nothing older than the first entry
