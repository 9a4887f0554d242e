"""Servers an operator (or an agent check) took out of load balancing by hand, against a real HAProxy.

``set server be/srv state drain`` leaves the server's weight as it was (``get weight`` still says 100,
``show stat`` says ``DRAIN``) and ``set weight`` does not bring it back: it takes no new traffic whatever
weight the actuator writes. Counted as serving, a decision putting every share on it was applied and the
whole listener answered 503 (the weight left on the other servers went to 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from opsloop.lb.haproxy import HaproxyAPI, parse_show_stat

from tests.controllers.actuators.support import decision, haproxy_actuator
from tests.helpers import unique

pytestmark = pytest.mark.integration


@pytest.fixture
def edge(lab_edge):
    return lab_edge.start()


def live(lab_edge) -> dict[str, int]:
    api = HaproxyAPI(lab_edge.admin_socket)
    return {s: api.get_weight(lab_edge.spec.backend, s)[0] for s in ("near", "far")}


def status(lab_edge, server: str) -> str:
    rows = parse_show_stat(HaproxyAPI(lab_edge.admin_socket).show_stat())
    return next(r["status"] for r in rows if r["pxname"] == lab_edge.spec.backend and r["svname"] == server)


def served(lab_edge, n: int = 4) -> list[int]:
    return [requests.get(lab_edge.url, timeout=5).status_code for _ in range(n)]


def test_decision_onto_a_drained_server_only_is_refused(edge, tmp_path: Path) -> None:
    act, sink = haproxy_actuator(edge, tmp_path, edge=unique("e"))
    assert act.apply(decision(1, {"near": 0.5, "far": 0.5}, edge=act.edge)).result == "applied"
    HaproxyAPI(edge.admin_socket).set_server_state(edge.spec.backend, "near", "drain")   # the operator
    assert status(edge, "near").startswith("DRAIN") and live(edge) == {"near": 128, "far": 128}
    assert act.target.down() == {"near"}
    # the controller (to which a DRAIN server is up) moves everything onto it
    r = act.apply(decision(2, {"near": 1.0, "far": 0.0}, edge=act.edge))
    assert r.result == "refused" and "near" in r.reason, r.reason
    assert live(edge) == {"near": 128, "far": 128}
    assert served(edge) == [200] * 4
    assert sink.records[-1].result == "refused"
    # a reconcile does not write it either, and the operator's drain stands
    assert act.reconcile() is None
    assert status(edge, "near").startswith("DRAIN")


def test_drained_server_share_released_and_drain_left_alone(edge, tmp_path: Path) -> None:
    act, _ = haproxy_actuator(edge, tmp_path, edge=unique("e"), max_step=0.1)
    api = HaproxyAPI(edge.admin_socket)
    api.set_server_state(edge.spec.backend, "far", "drain")
    # share 0 on the drained server: released at once (it carries no traffic), like a DOWN one
    r = act.apply(decision(1, {"near": 1.0, "far": 0.0}, edge=act.edge))
    assert r.result == "applied" and r.complete and live(edge) == {"near": 256, "far": 0}
    # a weight written to a drained server does not bring it back: the operator's state stands
    r = act.apply(decision(2, {"near": 0.9, "far": 0.1}, edge=act.edge))
    assert r.result == "applied"
    assert status(edge, "far").startswith("DRAIN")
    assert served(edge) == [200] * 4
    api.set_server_state(edge.spec.backend, "far", "ready")
    assert act.target.down() == set()
