"""Every safety rule of the actuator against a real HAProxy (lab edge: servers "near" and "far")."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.lb.haproxy import HaproxyAPI

from opsloop.controllers.actuators import metrics
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import (decision, haproxy_actuator, hide_socket, restore_socket,
                                               start_haproxy, stop_haproxy)
from tests.helpers import unique, wait_until

pytestmark = pytest.mark.integration


def live(lab_edge) -> dict[str, int]:
    api = HaproxyAPI(lab_edge.admin_socket)
    return {s: api.get_weight(lab_edge.spec.backend, s)[0] for s in ("near", "far")}


def counter(c, **labels: str) -> float:
    return c.labels(**labels)._value.get()


@pytest.fixture
def edge(lab_edge):
    return lab_edge.start()


def test_apply_idempotent_and_ordered(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    assert live(edge) == {"near": 100, "far": 100}
    r = act.apply(decision(1, {"near": 0.75, "far": 0.25}, edge=act.edge))
    assert r.result == "applied" and r.after == {"near": 192, "far": 64}
    assert live(edge) == {"near": 192, "far": 64}
    # Same version again: nothing written even if someone changed HAProxy meanwhile (proves no set weight).
    HaproxyAPI(edge.admin_socket).set_weight(edge.spec.backend, "far", 7)
    assert act.apply(decision(1, {"near": 0.75, "far": 0.25}, edge=act.edge)).result == "noop"
    assert live(edge)["far"] == 7
    # Older version refused, newer applied.
    assert act.apply(decision(0, {"near": 0.5, "far": 0.5}, edge=act.edge)).result == "stale_version"
    assert live(edge)["far"] == 7
    assert act.apply(decision(2, {"near": 0.5, "far": 0.5}, edge=act.edge)).result == "applied"
    assert live(edge) == {"near": 128, "far": 128}
    assert sink.results == ["applied", "noop", "stale_version", "applied"]
    assert sink.records[0].before == {"near": 100, "far": 100} and sink.records[0].after == {"near": 192, "far": 64}
    assert [e.version for e in act.store.history()] == [1, 2]


def test_bounded_step_and_release_of_down_origin(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"), max_step=0.1)
    want = {"near": 1.0, "far": 0.0}
    r = act.apply(decision(1, want, edge=act.edge))
    # from 0.5/0.5 at most 0.1 per apply
    assert r.result == "applied" and not r.complete
    first = live(edge)
    assert first == {"near": round(0.6 * 256), "far": 256 - round(0.6 * 256)}
    # same version again continues stepping (not a noop while incomplete), again by max_step
    assert act.apply(decision(1, want, edge=act.edge)).result == "applied"
    second = live(edge)
    assert 0 < (second["near"] - first["near"]) / 256 <= 0.1 + 1 / 256
    assert second["far"] > 0
    # "far" goes DOWN in HAProxy: its share leaves at once despite max_step
    edge.origins[1].health_file(edge.workdir).write_text("down")
    wait_until(lambda: act.target.down() == {"far"}, timeout=30, what="HAProxy marking far DOWN")
    r = act.apply(decision(1, want, edge=act.edge))
    assert r.result == "applied" and r.complete
    assert live(edge) == {"near": 256, "far": 0}
    assert act.apply(decision(1, want, edge=act.edge)).result == "noop"
    assert "released DOWN" in sink.records[2].reason


def test_all_zero_decision_refused_and_weights_held(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    act.apply(decision(1, {"near": 0.5, "far": 0.5}, edge=act.edge))
    # a decision that bypassed validation (all zero) is refused by the final guard
    zero = EdgeWeights.model_construct(**{**decision(2, {"near": 0.5, "far": 0.5}, edge=act.edge).__dict__,
                                          "weights": {"near": 0.0, "far": 0.0}})
    r = act.apply(zero)
    assert r.result == "refused" and "every server" in r.reason
    assert live(edge) == {"near": 128, "far": 128}
    # an origin this edge does not serve: refused, named
    r = act.apply(decision(3, {"near": 0.5, "elsewhere": 0.5}, edge=act.edge))
    assert r.result == "refused" and "elsewhere" in r.reason
    assert live(edge) == {"near": 128, "far": 128}


def test_stale_decision_is_held(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"), stale_after_s=30)
    r = act.apply(decision(1, {"near": 0.9, "far": 0.1}, edge=act.edge, age_s=31))
    assert r.result == "held" and r.stale
    assert live(edge) == {"near": 100, "far": 100}
    assert sink.records[-1].result == "held"


def test_dry_run_and_shadow_touch_nothing(edge, tmp_path: Path) -> None:
    e = unique("e")
    dry, dsink = haproxy_actuator(edge, tmp_path / "d", edge=e, mode="dry-run")
    r = dry.apply(decision(1, {"near": 0.9, "far": 0.1}, edge=e))
    assert r.result == "dry_run" and r.after == {"near": 230, "far": 26}
    assert dsink.records[0].mode.value == "dry-run"
    shadow, ssink = haproxy_actuator(edge, tmp_path / "s", edge=e, mode="shadow")
    r = shadow.apply(decision(1, {"near": 0.9, "far": 0.1}, edge=e))
    assert r.result == "shadow"
    assert metrics.SHADOW_DIFF.labels(e, "web")._value.get() == pytest.approx(0.4)
    assert live(edge) == {"near": 100, "far": 100}
    assert dry.store.history() == [] and shadow.store.history() == []


def test_target_gone_fails_cleanly_then_recovers(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    keep = hide_socket(edge)
    r = act.apply(decision(1, {"near": 0.25, "far": 0.75}, edge=act.edge))
    assert r.result == "failed" and r.retry and "does not exist" in r.reason
    assert counter(metrics.ERRORS, edge=act.edge, kind="unreachable") == 1
    restore_socket(edge, keep)
    r = act.apply(decision(1, {"near": 0.25, "far": 0.75}, edge=act.edge))
    assert r.result == "applied"
    assert live(edge) == {"near": 64, "far": 192}


def test_mismatch_on_read_back(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    real_write = act.target.write
    # a writer that drops one server's change, as a racing operator or a static-rr backend would
    act.target.write = lambda w: real_write({**w, "far": 100})  # type: ignore[method-assign]
    r = act.apply(decision(1, {"near": 0.75, "far": 0.25}, edge=act.edge))
    assert r.result == "mismatch" and r.after == {"near": 192, "far": 100}
    assert counter(metrics.ERRORS, edge=act.edge, kind="mismatch") == 1
    assert sink.records[-1].result == "mismatch"
    assert act.store.history() == []


def test_rollback(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    for v, near in ((1, 0.5), (2, 0.75), (3, 0.25)):
        assert act.apply(decision(v, {"near": near, "far": 1 - near}, edge=act.edge)).result == "applied"
    assert live(edge) == {"near": 64, "far": 192}
    r = act.rollback()
    assert r.result == "rolled_back" and r.version == 2
    assert live(edge) == {"near": 192, "far": 64}
    # the controller re-sending version 3 does not undo the rollback; version 4 applies
    assert act.apply(decision(3, {"near": 0.25, "far": 0.75}, edge=act.edge)).result == "noop"
    assert act.rollback(to_version=1).result == "rolled_back"
    assert live(edge) == {"near": 128, "far": 128}
    assert act.rollback(to_version=42).result == "refused"
    assert act.apply(decision(4, {"near": 0.25, "far": 0.75}, edge=act.edge)).result == "applied"
    assert sink.records[-2].action == "edge.weights.rollback"


def test_reconcile_after_haproxy_restart(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    assert act.reconcile() is None  # nothing applied yet: nothing to reconcile
    assert act.apply(decision(1, {"near": 0.75, "far": 0.25}, edge=act.edge)).result == "applied"
    assert act.reconcile() is None  # no drift
    stop_haproxy(edge)
    assert act.reconcile() is None  # unreachable: counted, not audited
    assert counter(metrics.ERRORS, edge=act.edge, kind="unreachable") == 1
    start_haproxy(edge)
    assert live(edge) == {"near": 100, "far": 100}  # restarted with the config weights
    r = act.reconcile()
    assert r is not None and r.result == "applied" and "drift" in r.reason
    assert live(edge) == {"near": 192, "far": 64}
    assert sink.records[-1].action == "edge.weights.reconcile"


def test_static_rr_backend_refuses_runtime_weights(lab_edge, tmp_path: Path) -> None:
    lab_edge.start(extra_backend_lines=["balance static-rr"])  # the later `balance` line wins
    act, sink = haproxy_actuator(lab_edge, tmp_path, edge=unique("e"))
    r = act.apply(decision(1, {"near": 0.75, "far": 0.25}, edge=act.edge))
    assert r.result == "failed" and "static" in r.reason.lower()
    assert counter(metrics.ERRORS, edge=act.edge, kind="command") == 1
    assert live(lab_edge) == {"near": 100, "far": 100}
