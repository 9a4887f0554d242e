"""`opsloop weights show|history|apply|rollback` against a real HAProxy (lab edge), as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from opsloop.lb.haproxy import HaproxyAPI

from opsloop.controllers.actuators.mapping import to_integer_weights
from tests.controllers.actuators.support import decision, haproxy_actuator, stop_haproxy
from tests.helpers import run_cli, unique, write_config

pytestmark = pytest.mark.integration


def live(lab_edge) -> dict[str, int]:
    api = HaproxyAPI(lab_edge.admin_socket)
    return {s: api.get_weight(lab_edge.spec.backend, s)[0] for s in ("near", "far")}


@pytest.fixture
def setup(lab_edge, tmp_path: Path):
    lab_edge.start()
    edge = unique("cli")
    config = write_config(tmp_path / "opsloop.yaml", {"controllers": {"actuator": {
        "store_dir": str(tmp_path / "store"), "max_step": 1.0,
        "targets": [{"edge": edge, "listener": "web", "kind": "haproxy", "socket": str(lab_edge.admin_socket),
                     "backend": lab_edge.spec.backend, "servers": {"near": "near", "far": "far"}}]}}})
    return lab_edge, edge, str(config), tmp_path / "store"


def audit_lines(stderr: str) -> list[dict]:
    docs = [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]
    return [d["fields"] for d in docs if d.get("event") == "audit"]


def test_help_has_examples() -> None:
    r = run_cli("weights", "--help")
    assert r.returncode == 0 and "opsloop weights rollback" in r.stdout


def test_show_apply_dry_run_and_history(setup) -> None:
    lab, edge, config, _ = setup
    r = run_cli("weights", "show", "--config", config, "--edge", edge, "--json")
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["live"] == {"near": 100, "far": 100} and doc["applied_version"] is None

    r = run_cli("weights", "apply", "--config", config, "--edge", edge, "--weights", "near=0.7,far=0.3", "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith("dry_run"), r.stdout + r.stderr
    assert live(lab) == {"near": 100, "far": 100}
    assert audit_lines(r.stderr)[0]["mode"] == "dry-run"

    r = run_cli("weights", "apply", "--config", config, "--edge", edge, "--weights", "near=0.7,far=0.3")
    assert r.returncode == 0 and r.stdout.startswith("applied"), r.stdout + r.stderr
    assert live(lab) == to_integer_weights({"near": 0.7, "far": 0.3}, 256)
    assert audit_lines(r.stderr)[0]["result"] == "applied"

    r = run_cli("weights", "show", "--config", config, "--edge", edge)
    assert r.returncode == 0 and "near" in r.stdout and "DRIFT" not in r.stdout
    HaproxyAPI(lab.admin_socket).set_weight(lab.spec.backend, "far", 5)
    assert "DRIFT" in run_cli("weights", "show", "--config", config, "--edge", edge).stdout

    r = run_cli("weights", "history", "--config", config, "--edge", edge, "--json")
    entries = [orjson.loads(x) for x in r.stdout.splitlines()]
    assert [e["action"] for e in entries] == ["manual"]


def test_manual_apply_does_not_block_the_controller(setup, tmp_path: Path) -> None:
    lab, edge, config, store = setup
    act, _ = haproxy_actuator(lab, store, edge=edge)
    assert act.apply(decision(5, {"near": 0.5, "far": 0.5}, edge=edge)).result == "applied"
    assert run_cli("weights", "apply", "--config", config, "--edge", edge, "--weights", "near=1,far=0").returncode == 0
    assert live(lab) == {"near": 256, "far": 0}
    # the controller's next version applies (a manual apply is not a newer version)
    assert act.apply(decision(6, {"near": 0.25, "far": 0.75}, edge=edge)).result == "applied"
    assert live(lab) == {"near": 64, "far": 192}


def test_rollback(setup) -> None:
    lab, edge, config, store = setup
    act, _ = haproxy_actuator(lab, store, edge=edge)
    for v, near in ((1, 0.5), (2, 0.75), (3, 0.25)):
        assert act.apply(decision(v, {"near": near, "far": 1 - near}, edge=edge)).result == "applied"
    r = run_cli("weights", "rollback", "--config", config, "--edge", edge)
    assert r.returncode == 0 and r.stdout.startswith("rolled_back: version 2"), r.stdout + r.stderr
    assert live(lab) == {"near": 192, "far": 64}
    rec = audit_lines(r.stderr)[0]
    assert rec["action"] == "edge.weights.rollback" and rec["result"] == "rolled_back"
    r = run_cli("weights", "rollback", "--config", config, "--edge", edge, "--to", "1")
    assert r.returncode == 0 and live(lab) == {"near": 128, "far": 128}
    r = run_cli("weights", "rollback", "--config", config, "--edge", edge, "--to", "99")
    assert r.returncode == 1 and "version 99 not in the history" in r.stdout
    assert live(lab) == {"near": 128, "far": 128}
    r = run_cli("weights", "history", "--config", config, "--edge", edge)
    assert [line.split()[1] for line in r.stdout.splitlines()] == ["v1", "v2", "v3", "v2", "v1"]


@pytest.mark.parametrize("weights, needle", [
    ("near=0.7,far=0.7", "sum to 1"),
    ("near=abc", "'near' is not a number"),
    ("near", "not origin=share"),
    ("near=1.5", "must be in [0, 1]"),
    ("elsewhere=1", "elsewhere"),
])
def test_bad_input_is_named(setup, weights: str, needle: str) -> None:
    lab, edge, config, _ = setup
    r = run_cli("weights", "apply", "--config", config, "--edge", edge, "--weights", weights)
    assert r.returncode != 0
    assert needle in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert live(lab) == {"near": 100, "far": 100}


def test_unknown_edge_and_gone_socket(setup) -> None:
    lab, edge, config, _ = setup
    r = run_cli("weights", "show", "--config", config, "--edge", "nope")
    assert r.returncode == 2 and "no actuator target for edge 'nope'" in r.stderr
    stop_haproxy(lab)
    r = run_cli("weights", "show", "--config", config, "--edge", edge)
    assert r.returncode == 1 and "live weights unavailable" in r.stdout and "does not exist" in r.stdout


def test_show_every_listener_of_an_edge_including_lvs(setup, tmp_path: Path) -> None:
    import sys

    from tests.controllers.actuators.test_lvs import HERE, seed_state

    lab, edge, config, store = setup
    state = tmp_path / "ipvs.json"
    state.write_text(json.dumps(seed_state()))
    doc = {"controllers": {"actuator": {"store_dir": str(store), "targets": [
        {"edge": edge, "listener": "web", "kind": "haproxy", "socket": str(lab.admin_socket),
         "backend": lab.spec.backend, "servers": {"near": "near", "far": "far"}},
        {"edge": edge, "listener": "app", "kind": "lvs", "service": "tcp:192.168.0.57:3306",
         "reals": {"eu": "192.168.82.21:3306", "us": "192.168.50.21:3306"},
         "command": [sys.executable, str(HERE / "fake_ipvsadm.py"), "--state", str(state)]}]}}}
    config2 = str(write_config(tmp_path / "two.yaml", doc))
    r = run_cli("weights", "apply", "--config", config2, "--edge", edge, "--listener", "app", "--weights", "eu=0.6,us=0.4")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("weights", "show", "--config", config2, "--edge", edge, "--json")
    assert r.returncode == 0, r.stderr
    docs = {d["listener"]: d for d in map(orjson.loads, r.stdout.splitlines())}
    assert docs["web"]["live"] == {"near": 100, "far": 100}
    assert docs["app"]["live"] == {"eu": 6000, "us": 4000} and docs["app"]["target"] == f"lvs:{edge}/app"
    r = run_cli("weights", "apply", "--config", config2, "--edge", edge, "--weights", "near=1")
    assert r.returncode == 2 and "several listeners" in r.stderr
