"""What the service schedules (``test_schedule_service.py``) found, one case each: a service restarted
while a slot failed static forgot the ``edge.fail_static`` finding the previous run had opened, so
the first fresh decision after the restart cleared nothing and the finding (and its page) stayed open
for good, with the gauge saying 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.records import EdgeWeights, Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators import service as service_mod
from opsloop.controllers.actuators.config import ActuatorConfig, HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.service import ActuatorService
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_schedule_faults import ORIGINS, FakeRuntime
from tests.controllers.actuators.test_schedule_service import STALE_S, Clock, Producer
from tests.helpers import unique


def _config(tmp: Path, edge: str) -> ActuatorConfig:
    return ActuatorConfig(stale_after_s=STALE_S, store_dir=tmp / "store", reconcile_interval_s=None, targets=[
        HaproxyTargetConfig(kind="haproxy", edge=edge, listener="web", socket=tmp / "web.sock", backend="be_web",
                            servers={o: o for o in ORIGINS})])


def _run(config: ActuatorConfig, edge: str, lb: FakeRuntime, clock: Clock, producer: Producer) -> ActuatorService:
    """One actuator process over the store and the LB (a restart builds another)."""
    svc = ActuatorService(config, "127.0.0.1:1", [edge], AuditLog([ListSink()]), consumer=object(),
                          producer=producer)
    act = svc.slots[("web", edge)].actuator
    act.target = HaproxyTarget(config.targets[0], api=lb)
    act.clock = clock.time
    return svc


def _findings(producer: Producer) -> list[Finding]:
    return [Finding.decode(v) for topic, v, _ in producer.sent if topic == "findings"]


def test_a_restart_while_failing_static_clears_the_finding_the_previous_run_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(service_mod, "time", clock)
    edge = unique("restart")
    config, lb, producer = _config(tmp_path, edge), FakeRuntime({o: 100 for o in ORIGINS}), Producer()
    gauge = metrics.FAIL_STATIC.labels("web", edge)

    first = _run(config, edge, lb, clock, producer)
    clock.advance(STALE_S + 1)
    first.tick(clock.mono)                              # no decision for stale_after_s: fail static
    [opened] = _findings(producer)
    assert not opened.cleared and gauge._value.get() == 1

    second = _run(config, edge, lb, clock, producer)    # the first process died; a new one starts
    assert gauge._value.get() == 1                      # still holding: nothing fresh came
    clock.advance(1.0)
    decision = EdgeWeights(version=1, listener="web", edge=edge, weights={"a": 0.5, "b": 0.5},
                           computed_at=clock.time(), reason="v1")
    second.handle_records([(f"web|{edge}".encode(), decision.encode())])
    second.tick(clock.mono)
    # the open finding said again (same incident: no new page), then cleared by the fresh decision
    *_, again, cleared = _findings(producer)
    assert not again.cleared and (again.id, again.first_seen) == (opened.id, opened.first_seen)
    assert cleared.cleared and (cleared.id, cleared.first_seen) == (opened.id, opened.first_seen)
    assert gauge._value.get() == 0

    n = len(producer.sent)
    third = _run(config, edge, lb, clock, producer)     # cleared before this restart: nothing carried over
    third.tick(clock.mono)
    assert gauge._value.get() == 0 and len(producer.sent) == n
