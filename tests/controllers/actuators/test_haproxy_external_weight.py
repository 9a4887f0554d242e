"""Servers whose weight the actuator must not write, against a real HAProxy (lab edge "near"/"far" plus one):

* a server with an ``agent-check`` whose agent answers a weight ("75%"): HAProxy sets its weight at every agent
  check. Written, it was put back by the agent and written again by every reconcile, for good (a tug of war:
  a ``set weight`` and an audit record per round, the edge's weight for it meaningless). Now it is reported
  (log once per change, ``opsloop_actuator_servers_left_alone{reason="agent_weight"}``, the audit reason) and
  its live weight kept; ``disable agent`` hands it back;
* a configured server the backend does not have (renamed, removed by a reload): ``get weight`` answered
  "No such server." and every apply and reconcile of the listener failed, the other servers never got their
  weights. Now it reads as 0, is DOWN (never counted as serving), is never written, and the others are.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.stack.process import free_port

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.store import WeightStore
from tests.controllers.actuators.support import ListSink, decision
from tests.helpers import captured_logs, unique, wait_until

pytestmark = pytest.mark.integration


class Agent:
    """An HAProxy agent on a loopback port: answers each connection with ``reply`` and closes it."""

    def __init__(self, reply: bytes = b"75%\n") -> None:
        self.reply = reply
        self.port = free_port()
        self._stop = threading.Event()
        self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", self.port))
        self._srv.listen(16)
        self._srv.settimeout(0.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                try:
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._srv.close()


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent()
    try:
        yield a
    finally:
        a.close()


class Spy:
    """Records the ``set weight`` commands the actuator sends (server names)."""

    def __init__(self, api: HaproxyAPI) -> None:
        self.sets: list[str] = []
        real = api.set_weight

        def set_weight(backend: str, server: str, weight: int) -> None:
            self.sets.append(server)
            real(backend, server, weight)
        api.set_weight = set_weight  # type: ignore[method-assign]


def actuator(lab_edge, store_dir: Path, servers: dict[str, str]) -> tuple[EdgeActuator, ListSink, Spy]:
    edge = unique("e")
    cfg = HaproxyTargetConfig(kind="haproxy", edge=edge, listener="web", socket=lab_edge.admin_socket,
                              backend=lab_edge.spec.backend, servers=servers)
    sink = ListSink()
    target = HaproxyTarget(cfg)
    act = EdgeActuator(target, edge, "web", WeightStore(store_dir, edge, "web"), AuditLog([sink]), max_step=1.0)
    return act, sink, Spy(target.api)


def weight(lab_edge, server: str) -> int:
    return HaproxyAPI(lab_edge.admin_socket).get_weight(lab_edge.spec.backend, server)[0]


def left_alone(act: EdgeActuator, reason: str) -> float:
    return metrics.LEFT_ALONE.labels(act.edge, "web", reason)._value.get()


def lines(logs, event: str) -> list[str]:
    return [line for line in logs.lines if line.startswith(event + " ")]


def test_a_server_weighted_by_its_agent_is_left_alone_not_fought(lab_edge, agent: Agent, tmp_path: Path) -> None:
    near = lab_edge.origins[0].port
    lab_edge.start(extra_backend_lines=[
        f"server agt 127.0.0.1:{near} weight 100 check inter 500ms agent-check agent-addr 127.0.0.1 "
        f"agent-port {agent.port} agent-inter 200ms"])
    wait_until(lambda: weight(lab_edge, "agt") == 75, timeout=30, what="the agent setting agt to 75%")
    act, sink, spy = actuator(lab_edge, tmp_path, {"near": "near", "far": "far", "agt": "agt"})
    with captured_logs() as logs:
        r = act.apply(decision(1, {"near": 0.5, "far": 0.25, "agt": 0.25}, edge=act.edge))
        assert r.result == "applied"
        # rounds of the agent and of reconcile: nobody fights, nothing is written or audited again
        for _ in range(3):
            wait_until(lambda: weight(lab_edge, "agt") == 75, timeout=10, what="agt at the agent's weight")
            assert act.reconcile() is None
        assert "left alone" in r.reason and "agent" in r.reason, r.reason
        assert r.after == {"near": 128, "far": 64, "agt": 75}
        assert "agt" not in spy.sets and sorted(spy.sets) == ["far", "near"]
        assert (weight(lab_edge, "near"), weight(lab_edge, "far")) == (128, 64)
        assert left_alone(act, "agent_weight") == 1 and left_alone(act, "absent") == 0
        assert act.apply(decision(1, {"near": 0.5, "far": 0.25, "agt": 0.25}, edge=act.edge)).result == "noop"
        assert sorted(spy.sets) == ["far", "near"] and sink.results == ["applied", "noop"]
        assert len(lines(logs, "servers_left_alone")) == 1, logs.lines   # once per change, not per round
    assert act.store.last() is not None and act.store.last().weights["agt"] == 64   # the intended weight
    # the operator hands the server back: the stored weight is reconciled onto it
    HaproxyAPI(lab_edge.admin_socket).command(f"disable agent {lab_edge.spec.backend}/agt")
    r = act.reconcile()
    assert r is not None and r.result == "applied" and weight(lab_edge, "agt") == 64, r
    assert left_alone(act, "agent_weight") == 0 and act.reconcile() is None


def test_a_configured_server_haproxy_does_not_have_is_reported_and_the_others_get_their_weights(
        lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    act, sink, spy = actuator(lab_edge, tmp_path, {"near": "near", "far": "far", "old": "old"})
    with captured_logs() as logs:
        r = act.apply(decision(1, {"near": 0.5, "far": 0.3, "old": 0.2}, edge=act.edge))
        assert r.result == "applied" and "left alone" in r.reason and "'old'" in r.reason, r.reason
        near, far = weight(lab_edge, "near"), weight(lab_edge, "far")
        assert r.after == {"near": near, "far": far, "old": 0} and near / far == pytest.approx(5 / 3, rel=0.02)
        assert "old" not in spy.sets and act.target.down() == {"old"}
        assert left_alone(act, "absent") == 1
        # not written every round, not counted as serving: a decision putting everything on it is refused
        assert act.reconcile() is None
        assert act.apply(decision(1, {"near": 0.5, "far": 0.3, "old": 0.2}, edge=act.edge)).result == "noop"
        r = act.apply(decision(2, {"near": 0.0, "far": 0.0, "old": 1.0}, edge=act.edge))
        assert r.result == "refused" and "DOWN" in r.reason, r.reason
        assert (weight(lab_edge, "near"), weight(lab_edge, "far")) == (near, far)
        assert act.apply(decision(3, {"near": 0.25, "far": 0.25, "old": 0.5}, edge=act.edge)).result == "applied"
        assert weight(lab_edge, "near") == weight(lab_edge, "far") == 64
        assert "old" not in spy.sets and sink.results == ["applied", "noop", "refused", "applied"]
        assert len(lines(logs, "servers_left_alone")) == 1, logs.lines
