"""Safety of the weight actuator on bad input: a torn or damaged history, refused decisions that must
not look fresh, a controller restarted at a lower version, a clock in the future, decisions that only
feed DOWN servers, and gauges that forget origins that went away. No Kafka: the service is driven by
``handle_records`` / ``tick`` (the consumer is not needed for them); the target is in memory."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.records import Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.actuators.store import Entry, WeightStore
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import ListSink
from tests.controllers.actuators.test_applier import ORIGINS, MemoryTarget
from tests.helpers import unique

SHARES = {"a": 0.5, "b": 0.25, "c": 0.25}


def decision(version: int, edge: str, listener: str = "l", weights: dict[str, float] | None = None, *,
             epoch: int = 0, computed_at: float | None = None) -> EdgeWeights:
    return EdgeWeights(version=version, epoch=epoch, listener=listener, edge=edge, weights=weights or SHARES,
                       computed_at=time.time() if computed_at is None else computed_at, reason=f"test {version}")


def actuator(tmp: Path, **kw) -> tuple[EdgeActuator, MemoryTarget, ListSink, str]:
    edge = unique("safe")
    target, sink = MemoryTarget(), ListSink()
    act = EdgeActuator(target, edge, "l", WeightStore(tmp, edge, "l"), AuditLog([sink]), max_step=1.0, **kw)
    return act, target, sink, edge


def service(tmp: Path, listeners: tuple[str, ...] = ("l",), stale_after_s: float = 10.0):
    edge = unique("svc")
    cfg = ActuatorConfig(stale_after_s=stale_after_s, store_dir=tmp, max_step=1.0, reconcile_interval_s=None,
                         targets=[{"edge": edge, "listener": lst, "kind": "haproxy", "socket": str(tmp / "none.sock"),
                                   "backend": f"be-{lst}", "servers": {o: o for o in ORIGINS}} for lst in listeners])
    sent: list[tuple[str, bytes, bytes]] = []

    class Producer:
        def send(self, topic, key=None, value=None):
            sent.append((topic, key, value))

    sink = ListSink()
    svc = ActuatorService(cfg, "127.0.0.1:1", [edge], AuditLog([sink]), consumer=object(), producer=Producer())
    targets = {}
    for lst in listeners:
        targets[lst] = MemoryTarget()
        svc.slots[(lst, edge)].actuator.target = targets[lst]
    return svc, targets, sent, sink, edge


def send(svc: ActuatorService, d: EdgeWeights) -> None:
    svc.handle_records([(f"{d.listener}|{d.edge}".encode(), d.encode())])


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def entry(v: int) -> Entry:
    return Entry(version=v, weights={"a": v, "b": 1}, shares={"a": 0.5, "b": 0.5}, decision={"a": 0.5, "b": 0.5})


# -- the history ------------------------------------------------------------------------------------
def test_append_after_a_torn_line_starts_on_a_line_of_its_own(tmp_path: Path) -> None:
    s = WeightStore(tmp_path, "e", "l")
    s.append(entry(1))
    s.append(entry(2))
    with open(s.path, "ab") as f:
        f.write(b'{"version": 3, "weig')   # a crash mid-write
    s.append(entry(3))
    s.append(entry(4))
    assert [e.version for e in s.history()] == [1, 2, 3, 4]
    assert s.path.read_bytes().count(b"\n") == 4 and b"weig{" not in s.path.read_bytes()


def test_a_damaged_history_holds_its_listener_only_with_fail_static_a_finding_and_a_metric(tmp_path: Path) -> None:
    svc, targets, sent, sink, edge = service(tmp_path, listeners=("bad", "good"))
    bad_store = svc.slots[("bad", edge)].actuator.store
    bad_store.append(entry(1))
    bad_store.append(entry(2))
    first, second = bad_store.path.read_bytes().splitlines()
    bad_store.path.write_bytes(b"\n".join([first, b"not a history entry", second]) + b"\n")
    send(svc, decision(5, edge, "bad"))
    send(svc, decision(5, edge, "good"))
    svc.tick(time.monotonic())
    assert targets["good"].weights == {"a": 128, "b": 64, "c": 64}        # the other listener goes on
    assert targets["bad"].writes == []                                   # nothing written on a guess
    assert gauge("opsloop_edge_fail_static", listener="bad", edge=edge) == 1
    assert gauge("opsloop_edge_fail_static", listener="good", edge=edge) == 0
    assert gauge("opsloop_actuator_errors_total", edge=edge, kind="store") == 1
    findings = [Finding.decode(v) for topic, _, v in sent if topic == "findings"]
    assert [f.where for f in findings] == [{"listener": "bad", "edge": edge}]
    assert str(bad_store.path) in findings[0].explanation and "line 2" in findings[0].explanation
    # the history repaired (moved aside): the next decision applies and clears the finding
    bad_store.path.rename(bad_store.path.with_suffix(".damaged"))
    send(svc, decision(6, edge, "bad"))
    svc.tick(time.monotonic())
    assert targets["bad"].weights == {"a": 128, "b": 64, "c": 64}
    assert gauge("opsloop_edge_fail_static", listener="bad", edge=edge) == 0
    assert Finding.decode(sent[-1][2]).cleared


# -- freshness and the order of decisions -------------------------------------------------------------
def test_refused_decisions_do_not_count_as_fresh_and_are_exported(tmp_path: Path) -> None:
    svc, targets, sent, sink, edge = service(tmp_path, stale_after_s=10.0)
    t0 = time.monotonic()
    send(svc, decision(5, edge))
    svc.tick(t0)
    assert sink.results == ["applied"]
    for dt in (4, 8, 12):                  # a controller restarted at version 3, sending every 4 s
        send(svc, decision(3, edge, weights={"a": 0.1, "b": 0.1, "c": 0.8}))
        svc.tick(t0 + dt)
    assert sink.results[1:4] == ["stale_version"] * 3
    assert targets["l"].weights == {"a": 128, "b": 64, "c": 64}
    assert gauge("opsloop_actuator_refused_decisions", edge=edge, listener="l") == 3
    assert gauge("opsloop_edge_fail_static", listener="l", edge=edge) == 1   # old weights are not silent
    assert any(topic == "findings" and not Finding.decode(v).cleared for topic, _, v in sent)
    send(svc, decision(5, edge))           # the live version again: fresh (noop), clears both
    svc.tick(t0 + 13)
    assert sink.results[-1] == "noop"
    assert gauge("opsloop_actuator_refused_decisions", edge=edge, listener="l") == 0
    assert gauge("opsloop_edge_fail_static", listener="l", edge=edge) == 0


def test_a_new_controller_epoch_wins_over_a_higher_version_and_its_predecessor_is_refused(tmp_path: Path) -> None:
    act, target, sink, edge = actuator(tmp_path)
    assert act.apply(decision(50, edge, epoch=0)).result == "applied"
    restarted = decision(1, edge, epoch=1_795_000_000_000, weights={"a": 0.25, "b": 0.25, "c": 0.5})
    assert act.apply(restarted).result == "applied"
    assert target.weights == {"a": 64, "b": 64, "c": 128}
    assert act.apply(decision(51, edge, epoch=0)).result == "stale_version"     # the old instance
    assert act.apply(restarted).result == "noop"
    assert act.store.high_stamp() == (1_795_000_000_000, 1)


def test_a_decision_from_the_future_is_refused_within_the_skew_it_applies(tmp_path: Path) -> None:
    act, target, sink, edge = actuator(tmp_path, max_clock_skew_s=5.0)
    r = act.apply(decision(1, edge, computed_at=time.time() + 3600))
    assert r.result == "refused" and "future" in r.reason and target.writes == []
    assert act.apply(decision(2, edge, computed_at=time.time() + 2)).result == "applied"


# -- never all-zero counts only servers that can serve ---------------------------------------------------
def test_a_decision_feeding_only_down_servers_is_refused(tmp_path: Path) -> None:
    act, target, sink, edge = actuator(tmp_path)
    target.down_set = {"a"}
    r = act.apply(decision(1, edge, weights={"a": 1.0, "b": 0.0, "c": 0.0}))
    assert r.result == "refused" and "DOWN" in r.reason
    assert target.writes == [] and target.weights == {"a": 100, "b": 100, "c": 100}
    r = act.apply(decision(2, edge, weights={"a": 0.5, "b": 0.5, "c": 0.0}))   # b can serve: applied
    assert r.result == "applied" and target.weights["b"] > 0


def test_a_step_bounded_move_never_leaves_only_down_servers(tmp_path: Path) -> None:
    act, target, sink, edge = actuator(tmp_path)
    target.weights = {"a": 256, "b": 0, "c": 0}
    target.down_set = {"a", "b"}          # c UP but at 0; a decision to c only would be fine...
    r = act.apply(decision(1, edge, weights={"a": 0.0, "b": 1.0, "c": 0.0}))  # ... but b is DOWN
    assert r.result == "refused" and target.writes == []


# -- gauges ---------------------------------------------------------------------------------------------
def test_weight_gauge_forgets_origins_that_went_away(tmp_path: Path) -> None:
    act, target, sink, edge = actuator(tmp_path)
    metrics.WEIGHT.labels(edge, "l", "retired").set(10)
    act.apply(decision(1, edge))
    assert gauge("opsloop_actuator_weight", edge=edge, listener="l", origin="retired") is None
    assert gauge("opsloop_actuator_weight", edge=edge, listener="l", origin="a") == 128
