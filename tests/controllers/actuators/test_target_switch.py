"""A listener whose target changes kind (LVS to HAProxy, then back) on the same weight history: the real service
restarted on the new config each time, its load balancers in process (the real HAProxy client parses the runtime
API's replies; ``ipvsadm``'s listing and ``-R`` input as the recording fake reads and prints them).

What an SRE expects: the other target's entries are not this target's live weights. They are set aside (one log
line names them), the slot starts from what the new target reads back (no reconcile writes an old LB's weights,
the controller's re-send of the version in force applies), and their stamps still order decisions (a replay of an
older version is ``stale_version``).

Before: on HAProxy the LVS entries (a 10000 scale) were damage, weights above 256: every decision ``held``, the
slot failing static until an operator moved the file aside, as the error said. Back on LVS, the HAProxy entries
were taken for the reals' weights: reconcile wrote them (64/192 of a 10000 scale) and the controller's re-send
of the version in force was a ``noop``, so LVS never got it until the weights changed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.records import EdgeWeights

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.mapping import to_integer_weights
from opsloop.controllers.actuators.service import ActuatorService
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_schedule_faults import FakeLvs, FakeRuntime
from tests.controllers.actuators.test_state_files_fuzz import Producer
from tests.helpers import captured_logs, unique

E1 = 1_790_000_000_000   # a controller's start time (past: one ahead of the clock is refused)
V1, V2 = {"a": 0.25, "b": 0.75}, {"a": 0.4, "b": 0.6}


def config(store: Path, edge: str, kind: str) -> ActuatorConfig:
    target: dict[str, Any] = (
        {"kind": "haproxy", "socket": str(store / "none.sock"), "backend": "be", "servers": {"a": "a", "b": "b"}}
        if kind == "haproxy" else
        {"kind": "lvs", "service": "tcp:192.0.2.10:443", "reals": {"a": "10.0.0.1:443", "b": "10.0.0.2:443"}})
    return ActuatorConfig(stale_after_s=600.0, store_dir=store, max_step=1.0, reconcile_interval_s=30.0,
                          backoff_initial_s=0.01, backoff_max_s=0.01,
                          targets=[{"edge": edge, "listener": "web", **target}])


class Slot:
    """The service on ``kind``'s config, restarted on the same store each time the target changes."""

    def __init__(self, tmp: Path) -> None:
        self.store_dir = tmp / "store"
        self.edge = unique("switch")
        self.sink = ListSink()
        self.svc: ActuatorService | None = None
        self.t = time.monotonic()

    def start(self, kind: str, lb: Any) -> ActuatorService:
        cfg = config(self.store_dir, self.edge, kind)
        self.svc = ActuatorService(cfg, "127.0.0.1:1", [self.edge], AuditLog([self.sink]), consumer=object(),
                                   producer=Producer())
        act = self.svc.slots[("web", self.edge)].actuator
        act.target = HaproxyTarget(cfg.targets[0], api=lb) if kind == "haproxy" else lb
        return self.svc

    def lvs(self, weights: dict[str, int]) -> FakeLvs:
        return FakeLvs(config(self.store_dir, self.edge, "lvs").targets[0], weights)   # type: ignore[arg-type]

    def tick(self) -> None:
        assert self.svc is not None
        self.t += 1.0
        self.svc.tick(self.t)

    def send(self, version: int, shares: dict[str, float]) -> str:
        """The controller's decision (E1, ``version``); the result the actuator audited for it."""
        assert self.svc is not None
        d = EdgeWeights(version=version, epoch=E1, listener="web", edge=self.edge, weights=shares,
                        computed_at=time.time(), reason=f"v{version}")
        mark = len(self.sink.records)
        self.svc.handle_records([(f"web|{self.edge}".encode(), d.encode())])
        self.tick()
        return " ".join(r.result for r in self.sink.records[mark:] if r.action == "edge.weights.apply")

    def fail_static(self) -> float:
        return metrics.FAIL_STATIC.labels("web", self.edge)._value.get()

    def store_errors(self) -> float:
        return metrics.ERRORS.labels(self.edge, "store")._value.get()


def set_aside_lines(logs: Any) -> list[str]:
    return [line for line in logs.lines if line.startswith("history_set_aside")]


def test_a_listener_switched_from_lvs_to_haproxy_and_back_starts_from_what_the_new_target_reads_back(
        tmp_path: Path) -> None:
    slot = Slot(tmp_path)
    lvs = slot.lvs({"a": 5000, "b": 5000})
    slot.start("lvs", lvs)
    assert slot.send(1, V1) == "applied" and slot.send(2, V2) == "applied"
    assert lvs.weights == to_integer_weights(V2, 10_000)

    # the listener moves to HAProxy (its config weights live); the controller keeps sending version 2
    haproxy = FakeRuntime({"a": 100, "b": 100})
    errors = slot.store_errors()
    with captured_logs() as logs:
        svc = slot.start("haproxy", haproxy)
        slot.tick()                                          # reconcile: nothing of this target's to put back
        assert haproxy.sets == [] and slot.fail_static() == 0
        assert slot.send(2, V2) == "applied", slot.sink.records[-1].reason   # was held: weights above 256
        assert haproxy.weights == to_integer_weights(V2, 256)
        assert slot.send(1, V1) == "stale_version"           # the LVS stamps still order decisions
        store = svc.slots[("web", slot.edge)].actuator.store
        assert [(e.version, e.target) for e in store.history()] == [(2, "haproxy")]
        assert svc.slots[("web", slot.edge)].actuator.rollback(1).result == "refused"   # an LVS version: not here
        slot.tick()
    assert haproxy.weights == to_integer_weights(V2, 256) and slot.fail_static() == 0
    assert slot.store_errors() == errors
    [said] = set_aside_lines(logs)                           # once, however often the slot read its history
    assert str(store.path) in said and "'entries': 2" in said and "lvs" in said, said

    # and back to LVS, whose reals keepalived set to their configured weights meanwhile
    lvs = slot.lvs({"a": 3000, "b": 3000})
    with captured_logs() as logs:
        slot.start("lvs", lvs)
        slot.tick()
        assert lvs.sets == [], lvs.sets                      # was: HAProxy's 102/154 written to the reals
        assert slot.send(2, V2) == "applied"                 # was a noop: LVS never got version 2
        assert lvs.weights == to_integer_weights(V2, 10_000)
    [said] = set_aside_lines(logs)                           # both earlier eras: LVS's too, before the switch
    assert "'entries': 3" in said and "haproxy" in said, said
    assert slot.fail_static() == 0 and slot.store_errors() == errors


@pytest.mark.parametrize("target", ['"nginx"', "5", "null", '["lvs"]'])
def test_an_entry_naming_no_known_target_is_damage_named_by_field(tmp_path: Path, target: str) -> None:
    slot = Slot(tmp_path)
    lvs = slot.lvs({"a": 5000, "b": 5000})
    svc = slot.start("lvs", lvs)
    assert slot.send(1, V1) == "applied"
    store = svc.slots[("web", slot.edge)].actuator.store
    store.path.write_bytes(store.path.read_bytes().replace(b'"target":"lvs"', b'"target":' + target.encode()))
    assert slot.send(2, V2) == "held"
    reason = slot.sink.records[-1].reason
    assert f"{store.path} line 1" in reason and "target is" in reason, reason
