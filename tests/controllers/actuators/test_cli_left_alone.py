"""`opsloop weights show` names the HAProxy servers the actuator leaves alone, and why (real HAProxy, lab edge).

Before (old code): `show` printed only live weights next to the stored ones. A server absent from the backend
(read as 0) and one weighted by its agent check (75 from the agent) both showed "DRIFT" against the weight the
actuator intended, although the actuator leaves them alone on purpose and reports no drift for them; nothing
said they were left alone or why, in text or --json. Now each is flagged "LEFT ALONE: <why>" (no DRIFT), and
--json carries ``left_alone`` {origin: why}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from opsloop.lb.haproxy import HaproxyAPI

from tests.controllers.actuators.test_haproxy_external_weight import Agent, agent  # noqa: F401 - fixture
from tests.controllers.actuators.test_lvs import HERE, seed_state
from tests.helpers import run_cli, unique, wait_until, write_config

pytestmark = pytest.mark.integration


def test_show_names_the_servers_left_alone_and_why_without_calling_them_drift(
        lab_edge, agent: Agent, tmp_path: Path) -> None:  # noqa: F811 - the agent fixture
    near = lab_edge.origins[0].port
    lab_edge.start(extra_backend_lines=[
        f"server agt 127.0.0.1:{near} weight 100 check inter 500ms agent-check agent-addr 127.0.0.1 "
        f"agent-port {agent.port} agent-inter 200ms"])
    api = HaproxyAPI(lab_edge.admin_socket)
    wait_until(lambda: api.get_weight(lab_edge.spec.backend, "agt")[0] == 75, timeout=30,
               what="the agent setting agt to 75%")
    edge = unique("cli")
    config = str(write_config(tmp_path / "opsloop.yaml", {"controllers": {"actuator": {
        "store_dir": str(tmp_path / "store"), "max_step": 1.0,
        "targets": [{"edge": edge, "listener": "web", "kind": "haproxy", "socket": str(lab_edge.admin_socket),
                     "backend": lab_edge.spec.backend,
                     "servers": {"near": "near", "far": "far", "agt": "agt", "old": "old"}}]}}}))
    # the stored (intended) weights of agt and old differ from their live ones: 75 from the agent, 0 absent
    r = run_cli("weights", "apply", "--config", config, "--edge", edge, "--weights",
                "near=0.4,far=0.2,agt=0.2,old=0.2")
    assert r.returncode == 0 and r.stdout.startswith("applied"), r.stdout + r.stderr

    r = run_cli("weights", "show", "--config", config, "--edge", edge, "--json")
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["live"]["agt"] == 75 and doc["live"]["old"] == 0 and doc["applied_weights"]["agt"] != 75
    assert sorted(doc["left_alone"]) == ["agt", "old"], doc   # old code: no "left_alone"
    assert "agent check" in doc["left_alone"]["agt"] and "not in backend" in doc["left_alone"]["old"]
    assert doc["left_alone_error"] is None

    r = run_cli("weights", "show", "--config", config, "--edge", edge)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert "LEFT ALONE" in rows["agt"] and "agent check" in rows["agt"], r.stdout
    assert "LEFT ALONE" in rows["old"] and "not in backend" in rows["old"], r.stdout
    assert "DRIFT" not in r.stdout, r.stdout   # old code: agt and old both flagged DRIFT
    assert "LEFT ALONE" not in rows["near"] + rows["far"]

    # the operator hands agt back: no longer left alone, and its weight (the agent's) is now drift
    api.command(f"disable agent {lab_edge.spec.backend}/agt")
    doc = orjson.loads(run_cli("weights", "show", "--config", config, "--edge", edge, "--json").stdout)
    assert sorted(doc["left_alone"]) == ["old"], doc
    r = run_cli("weights", "show", "--config", config, "--edge", edge)
    assert "DRIFT" in [line for line in r.stdout.splitlines() if line.split()[0] == "agt"][0], r.stdout


def test_show_of_an_lvs_target_leaves_none_alone(tmp_path: Path) -> None:
    state = tmp_path / "ipvs.json"
    state.write_text(orjson.dumps(seed_state()).decode())
    edge = unique("cli")
    config = str(write_config(tmp_path / "opsloop.yaml", {"controllers": {"actuator": {
        "store_dir": str(tmp_path / "store"), "targets": [
            {"edge": edge, "listener": "app", "kind": "lvs", "service": "tcp:192.168.0.57:3306",
             "reals": {"eu": "192.168.82.21:3306", "us": "192.168.50.21:3306"},
             "command": [sys.executable, str(HERE / "fake_ipvsadm.py"), "--state", str(state)]}]}}}))
    r = run_cli("weights", "show", "--config", config, "--edge", edge, "--json")
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["left_alone"] == {} and doc["left_alone_error"] is None and doc["live"]
