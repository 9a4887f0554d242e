"""LVS under keepalived/ldirectord (quiescent mode): a dead real is set to weight 0, not marked DOWN.
The actuator must read that as DOWN (live 0, stored > 0) and leave it at 0 — reconcile, a fresh
decision and a rollback must not send traffic back to it — until the health checker restores a
weight; and ``ipvsadm -R`` batches go increases first (applied line by line). Fake ipvsadm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsloop.controllers.actuators.applier import EdgeActuator
from tests.controllers.actuators.support import ListSink, decision
from tests.controllers.actuators.test_lvs import HERE, calls, lvs_actuator

SERVICE = "192.0.2.10:443"
REALS = {"eu": "10.0.0.1:443", "us": "10.0.1.1:443", "spare": "10.0.2.1:443"}


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    state = tmp_path / "ipvs.json"
    state.write_text(json.dumps({"services": [{"proto": "TCP", "addr": SERVICE, "sched": "wrr", "reals": [
        {"addr": addr, "fwd": "Masq", "w": 1, "active": 0, "inactive": 0} for addr in REALS.values()]}]}))
    return state


def set_live(state: Path, origin: str, weight: int) -> None:
    """What keepalived does to a real (``ipvsadm -e ... -w N``), behind the actuator's back."""
    doc = json.loads(state.read_text())
    next(r for r in doc["services"][0]["reals"] if r["addr"] == REALS[origin])["w"] = weight
    state.write_text(json.dumps(doc))


def restores(state: Path) -> list[list[str]]:
    return [c["stdin"].splitlines() for c in calls(state) if c["argv"] == ["-R"]]


def quiesced_setup(fake: Path, tmp_path: Path, max_step: float = 1.0) -> tuple[EdgeActuator, ListSink]:
    act, sink = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS, max_step=1.0)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied" and act.read() == {"eu": 7000, "us": 3000, "spare": 0}
    act.max_step = max_step  # from here on (the first apply reached 0.7/0.3 in one step)
    set_live(fake, "eu", 0)  # keepalived: eu's health check failed
    return act, sink


def test_reconcile_leaves_a_quiesced_real_at_zero_then_resumes_when_restored(fake: Path, tmp_path: Path) -> None:
    act, sink = quiesced_setup(fake, tmp_path)
    n = len(restores(fake))
    assert act.reconcile() is None  # no drift: the health checker's 0 stays
    assert act.read() == {"eu": 0, "us": 3000, "spare": 0} and len(restores(fake)) == n
    assert act.target.down({"eu": 7000, "us": 3000, "spare": 0}) == {"eu"}
    # real drift on another origin while eu is quiesced: repaired, eu still held at 0
    set_live(fake, "us", 5)
    r = act.reconcile()
    assert r is not None and r.result == "applied" and "quiesced" in r.reason
    assert act.read() == {"eu": 0, "us": 3000, "spare": 0}
    assert sink.records[-1].action == "edge.weights.reconcile" and sink.records[-1].after["eu"] == 0
    # keepalived restores eu (its own configured weight): normal operation, the stored weights come back
    set_live(fake, "eu", 1)
    assert act.target.down({"eu": 7000, "us": 3000, "spare": 0}) == set()
    r = act.reconcile()
    assert r is not None and r.result == "applied"
    assert act.read() == {"eu": 7000, "us": 3000, "spare": 0}


def test_a_fresh_decision_does_not_revive_a_quiesced_real(fake: Path, tmp_path: Path) -> None:
    act, sink = quiesced_setup(fake, tmp_path, max_step=0.1)
    # within max_step of the stored 0.7/0.3 (as HAProxy steps from a DOWN server's kept weight)
    r = act.apply(decision(2, {"eu": 0.6, "us": 0.4, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied" and r.complete, r.reason
    assert act.read() == {"eu": 0, "us": 4000, "spare": 0}
    assert restores(fake)[-1][0].endswith("-r 10.0.1.1:443 -m -w 4000")  # the increase first
    assert "-e -t 192.0.2.10:443 -r 10.0.0.1:443 -m -w 0" in restores(fake)[-1]
    assert r.after == {"eu": 0, "us": 4000, "spare": 0} and sink.records[-1].after["eu"] == 0
    assert "held quiesced" in r.reason
    assert act.store.last().weights == {"eu": 6000, "us": 4000, "spare": 0}  # the intended weights
    assert act.apply(decision(2, {"eu": 0.6, "us": 0.4, "spare": 0.0}, edge=act.edge, listener="app")).result == "noop"
    assert act.reconcile() is None and act.read()["eu"] == 0  # still quiesced
    set_live(fake, "eu", 1)  # restored
    assert act.reconcile() is not None and act.read() == {"eu": 6000, "us": 4000, "spare": 0}


def test_a_decision_feeding_only_the_quiesced_real_is_refused(fake: Path, tmp_path: Path) -> None:
    act, sink = quiesced_setup(fake, tmp_path)
    n = len(restores(fake))
    r = act.apply(decision(2, {"eu": 1.0, "us": 0.0, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "refused" and "DOWN" in r.reason and sink.records[-1].result == "refused"
    assert len(restores(fake)) == n and act.read() == {"eu": 0, "us": 3000, "spare": 0}


def test_a_quiesced_real_with_share_zero_is_released_at_once(fake: Path, tmp_path: Path) -> None:
    act, _ = quiesced_setup(fake, tmp_path, max_step=0.1)
    r = act.apply(decision(2, {"eu": 0.0, "us": 0.5, "spare": 0.5}, edge=act.edge, listener="app"))
    assert r.result == "applied" and "released DOWN origin(s) ['eu']" in r.reason
    assert act.read()["eu"] == 0 and act.read()["us"] > 0


def test_rollback_does_not_revive_a_quiesced_real(fake: Path, tmp_path: Path) -> None:
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS, max_step=1.0)
    assert act.apply(decision(1, {"eu": 0.5, "us": 0.5}, edge=act.edge, listener="app")).result == "applied"
    assert act.apply(decision(2, {"eu": 0.8, "us": 0.2}, edge=act.edge, listener="app")).result == "applied"
    set_live(fake, "eu", 0)
    r = act.rollback()
    assert r.result == "rolled_back" and act.read() == {"eu": 0, "us": 5000, "spare": 0}


def test_restore_batches_go_increases_first_so_no_torn_prefix_is_all_zero(fake: Path, tmp_path: Path) -> None:
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS, max_step=1.0)
    assert act.apply(decision(1, {"eu": 1.0}, edge=act.edge, listener="app")).result == "applied"
    assert act.read() == {"eu": 10000, "us": 0, "spare": 0}
    assert act.apply(decision(2, {"us": 0.4, "spare": 0.6}, edge=act.edge, listener="app")).result == "applied"
    batch = restores(fake)[-1]
    assert [line.split(" -r ")[1].split()[0] for line in batch] == ["10.0.1.1:443", "10.0.2.1:443", "10.0.0.1:443"]
    # ipvsadm -R applies line by line: replay every prefix from the state before the batch
    for k in range(len(batch) + 1):
        set_live(fake, "eu", 10000), set_live(fake, "us", 0), set_live(fake, "spare", 0)
        subprocess.run([sys.executable, str(HERE / "fake_ipvsadm.py"), "--state", str(fake), "-R"],
                       input="\n".join(batch[:k]) + "\n", text=True, check=True)
        assert sum(act.read().values()) >= 10000, f"torn after {k} line(s): {act.read()}"
