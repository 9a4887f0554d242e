"""An LVS real's connection thresholds (``-x``/``-y``: keepalived's ``uthreshold``/``lthreshold``, or an
operator's limit on an origin) survive the actuator's batches. The kernel sets them from every ``-e`` edit
(``__ip_vs_update_dest``: 0 when the edit leaves them out, i.e. no limit); the recording fake does the same.
Before, every apply, reconcile and undo lifted the limit for good."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsloop.controllers.actuators import metrics
from tests.controllers.actuators.test_lvs import REALS, calls, lvs_actuator, seed_state, weights_in
from tests.controllers.actuators.support import decision

SERVICE = "192.168.0.57:3306"


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    state = seed_state()
    svc = next(s for s in state["services"] if s["addr"] == SERVICE)
    for r in svc["reals"]:
        if r["addr"] == REALS["eu"]:
            r["x"], r["y"] = 500, 400     # keepalived: uthreshold 500, lthreshold 400
    path = tmp_path / "ipvs.json"
    path.write_text(json.dumps(state))
    return path


def limits(state: Path) -> dict[str, tuple[int, int]]:
    svc = next(s for s in json.loads(state.read_text())["services"] if s["addr"] == SERVICE)
    return {r["addr"]: (r.get("x", 0), r.get("y", 0)) for r in svc["reals"]}


def test_apply_and_reconcile_keep_connection_thresholds(fake: Path, tmp_path: Path) -> None:
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert weights_in(fake, SERVICE)[REALS["eu"]] == (7000, "Tunnel")
    assert limits(fake)[REALS["eu"]] == (500, 400)
    assert limits(fake)[REALS["us"]] == (0, 0)
    batch = [c["stdin"] for c in calls(fake) if c["argv"] == ["-R"]][-1]
    assert f"-r {REALS['eu']} -i -w 7000 -x 500 -y 400" in batch
    # drift put back by reconcile: the limit stays too
    doc = json.loads(fake.read_text())
    for r in next(s for s in doc["services"] if s["addr"] == SERVICE)["reals"]:
        if r["addr"] == REALS["eu"]:
            r["w"] = 1
    fake.write_text(json.dumps(doc))
    assert act.reconcile().result == "applied"
    assert weights_in(fake, SERVICE)[REALS["eu"]] == (7000, "Tunnel")
    assert limits(fake)[REALS["eu"]] == (500, 400)


def test_unreadable_thresholds_write_nothing(fake: Path, tmp_path: Path) -> None:
    """A listing that does not say the limits: failed, nothing written (a write would lift them)."""
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    real_run = act.target._run
    act.target._run = lambda args, stdin=None: (  # type: ignore[method-assign]
        real_run(["-Ln", "--exact"]) if "--thresholds" in args else real_run(args, stdin))
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "Uthreshold" in r.reason, r.reason
    assert metrics.ERRORS.labels(act.edge, "parse")._value.get() == 1
    assert not [c for c in calls(fake) if c["argv"] == ["-R"]]
    assert limits(fake)[REALS["eu"]] == (500, 400)
