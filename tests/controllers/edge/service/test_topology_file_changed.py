"""The topology file is read once, at start. Edited while the service runs (an origin drained with
``healthy: false`` during an incident), the edit went unapplied without a word, and a file broken meanwhile was
found only by the restart it then stopped (exit 78, not restarted by systemd). Now each change is said once:
``topology_file_changed`` (not applied until a restart) or ``topology_file_broken`` (a restart would fail)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsloop.config import Settings
from opsloop.controllers.edge.service import app as app_module
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.edge.service.config import EdgeServiceSettings
from opsloop.controllers.edge.service.loop import ControlLoop
from tests.helpers import captured_logs

TOPOLOGY = """listeners:
  - name: web
    edges: [{name: ams}]
    origins: [{name: near, capacity_rps: 40}, {name: far, capacity_rps: 1000}]
    latency_ms: {ams: {near: 2, far: 30}}
"""


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))   # a change whatever the clock's grain


def _service(tmp_path: Path) -> tuple[EdgeService, Path]:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    cfg = EdgeServiceSettings.model_validate({"interval_s": 1, "api": {"enabled": False}, "overrides_file": None,
                                              "topology_file": "topology.yaml"})
    svc = EdgeService(Settings.model_validate({}), cfg, config_dir=tmp_path)
    svc.loop = ControlLoop(svc.store, svc.book, cfg.controller_settings(), lambda records, findings: None)
    return svc, path


def _events(logs) -> list[str]:
    return [line.split(" ", 1)[0] for line in logs.lines if line.startswith("topology_file")]


def test_a_change_or_a_broken_file_is_said_once_and_the_running_topology_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(app_module, "TOPOLOGY_CHECK_S", 0.0, raising=False)   # looked at every tick
    svc, path = _service(tmp_path)
    try:
        with captured_logs() as logs:
            svc.tick()
            assert _events(logs) == []   # untouched: nothing said
            _write(path, TOPOLOGY.replace("capacity_rps: 40}", "capacity_rps: 40, healthy: false}"))
            svc.tick()
            svc.tick()
            assert _events(logs) == ["topology_file_changed"]   # once per change, not per tick
            assert "restart" in logs.lines[-1]
            _write(path, "listeners: [")
            svc.tick()
            assert _events(logs) == ["topology_file_changed", "topology_file_broken"]
            assert "exit 78" in logs.lines[-1] and str(path) in logs.lines[-1]
            _write(path, TOPOLOGY)   # put back as it was: no warning
            svc.tick()
            assert _events(logs) == ["topology_file_changed", "topology_file_broken"]
        # the running topology is the one the service started with, whatever the file says meanwhile
        assert svc.store.snapshot("web").spec.origins[0].healthy is True
        assert svc.loop.status()["web"]["last_tick"]["outcome"] == "waiting"
    finally:
        svc.stop()


@pytest.mark.parametrize("gone", ["deleted", "fifo", "inline"])
def test_a_deleted_file_a_fifo_or_an_inline_topology(tmp_path: Path, monkeypatch, gone: str) -> None:
    monkeypatch.setattr(app_module, "TOPOLOGY_CHECK_S", 0.0, raising=False)
    svc, path = _service(tmp_path)
    try:
        if gone == "inline":
            svc.topology_file = None
        path.unlink()
        if gone == "fifo":
            os.mkfifo(path)   # never opened: the tick comes back
        with captured_logs() as logs:
            svc.tick()
        assert _events(logs) == ([] if gone == "inline" else ["topology_file_broken"])
    finally:
        svc.stop()
