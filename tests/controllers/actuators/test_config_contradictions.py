"""Actuator settings each valid alone that fight each other once live: refused at load, naming both.

* two origins mapped to one HAProxy server (or one IPVS real): the batch writes that server twice,
  the read-back gives both origins the last weight, every apply ends ``mismatch`` and the split the
  controller asked for never reaches the load balancer (shown below on an in-memory HAProxy);
* two listeners driving one HAProxy backend (or one IPVS virtual service): each apply undoes the
  other's weights, and drift repair makes them flap;
* across sections, an actuator ``stale_after_s`` not above the edge controller's ``interval_s``: every
  decision is stale before the next arrives, the actuator fails static between them (``opsloop config
  check`` and every service's load refuse it in one line naming both keys).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.config import ConfigError, Settings, load_settings, validation_errors
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import ActuatorConfigError, HaproxyTargetConfig, actuator_config
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.store import WeightStore
from opsloop.records import EdgeWeights
from tests.controllers.actuators.support import ListSink
from tests.helpers import REPO, run_cli, write_config


def haproxy(listener: str = "web", backend: str = "be_web", socket: str = "/run/haproxy/admin.sock",
            servers: dict[str, str] | None = None) -> dict:
    return {"kind": "haproxy", "edge": "ams1", "listener": listener, "socket": socket, "backend": backend,
            "servers": servers or {"near": "near", "far": "far"}}


def lvs(listener: str = "web", service: str = "tcp:10.0.0.1:80", reals: dict[str, str] | None = None) -> dict:
    return {"kind": "lvs", "edge": "ams1", "listener": listener, "service": service,
            "reals": reals or {"near": "10.0.1.1:80", "far": "10.0.2.1:80"}}


def load(*targets: dict):
    return actuator_config(Settings(controllers={"actuator": {"targets": list(targets)}}))


@pytest.mark.parametrize("targets, message", [
    ([haproxy(servers={"near": "srv1", "far": "srv1"})],
     "origins 'near' and 'far' are both HAProxy server 'srv1'"),
    ([lvs(reals={"near": "10.0.1.1:80", "far": "10.0.1.1:80"})],
     "origins 'near' and 'far' are both real server '10.0.1.1:80'"),
    ([haproxy("web"), haproxy("api")],
     "listeners 'web' and 'api' both drive HAProxy backend 'be_web' at /run/haproxy/admin.sock"),
    ([lvs("web"), lvs("api")],
     "listeners 'web' and 'api' both drive virtual service 'tcp:10.0.0.1:80'"),
])
def test_contradictory_targets_are_refused_naming_both(targets: list[dict], message: str) -> None:
    with pytest.raises(ActuatorConfigError) as e:
        load(*targets)
    assert message in str(e.value)


def test_distinct_servers_backends_and_services_pass() -> None:
    cfg = load(haproxy("web"), haproxy("api", backend="be_api"), lvs("dns", service="udp:10.0.0.1:53"),
               haproxy("ws", socket="/run/haproxy/other.sock"),
               {**haproxy("web"), "edge": "fra1"}, {**lvs("api"), "edge": "fra1"})  # other edge: other machine
    assert [t.listener for t in cfg.targets] == ["web", "api", "dns", "ws", "web", "api"]


class MemoryHaproxy:
    """The runtime API's get/set weight on an in-memory backend."""

    def __init__(self) -> None:
        self.weights = {"srv1": 100}

    def get_weight(self, backend: str, server: str) -> tuple[int, int]:
        return self.weights[server], 100

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        self.weights[server] = weight

    def show_stat(self) -> str:
        return "# pxname,svname,status\nbe_web,srv1,UP\n\n"   # HAProxy ends every answer with an empty line


def test_why_two_origins_on_one_server_cannot_work(tmp_path: Path) -> None:
    # what the refused setting did (built without validation, as before)
    cfg = HaproxyTargetConfig.model_construct(**haproxy(servers={"near": "srv1", "far": "srv1"}), weight_total=256,
                                              timeout_s=2.0)
    act = EdgeActuator(HaproxyTarget(cfg, api=MemoryHaproxy()), "ams1", "web", WeightStore(tmp_path, "ams1", "web"),
                       AuditLog([ListSink()]), max_step=1.0)
    res = act.apply(EdgeWeights(version=1, listener="web", edge="ams1", weights={"near": 0.25, "far": 0.75},
                                computed_at=time.time()))
    assert res.result == "mismatch"


# -- across sections: the actuator's staleness against the controller's interval ----------------------
EDGE = {"topology_file": str(REPO / "controllers" / "edge" / "topology.yaml")}


def test_an_actuator_that_would_find_every_decision_stale_is_refused_naming_both_keys(tmp_path: Path) -> None:
    # one decision per 15 s: at stale_after_s 15 each one is stale before the next, the actuator fails static
    doc = {"controllers": {"actuator": {"stale_after_s": 15}, "edge": {**EDGE, "interval_s": 15}}}
    line = ("controllers.actuator.stale_after_s (15) must be above controllers.edge.interval_s (15): the controller "
            "publishes one decision per interval")
    errors = validation_errors(doc)
    assert len(errors) == 1 and errors[0].startswith(line), errors
    with pytest.raises(ConfigError, match=r"1 error:\n  controllers\.actuator\.stale_after_s \(15\)"):
        load_settings(write_config(tmp_path / "bad.yaml", doc), discover=False)
    res = run_cli("config", "check", str(write_config(tmp_path / "bad.yaml", doc)))
    assert res.returncode == 2 and line in res.stderr and len(res.stderr.strip().splitlines()) == 2, res.stderr


def test_an_actuator_staleness_above_the_interval_passes_and_no_edge_section_means_no_check() -> None:
    assert validation_errors({"controllers": {"actuator": {"stale_after_s": 16}, "edge": {**EDGE, "interval_s": 15}}}) == []
    assert validation_errors({"controllers": {"actuator": {"stale_after_s": 1}}}) == []
