"""Edge API changes survive a restart: an overlay file on top of the topology file."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from opsloop.controllers.edge.service import overrides as overrides_mod
from opsloop.controllers.edge.service import store as store_mod
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.overrides import OverridesError, load_overrides
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.audit.trail import AuditLog
from tests.trickle import ends_within


class Recorder:
    def __init__(self) -> None:
        self.records: list = []

    def submit(self, record) -> None:
        self.records.append(record)


def topology(origins=("near", "far")) -> TopologySpec:
    return TopologySpec.model_validate({"listeners": [{
        "name": "web", "edges": [{"name": "ams"}, {"name": "fra"}],
        "origins": [{"name": o, "capacity_rps": 40 if o == "near" else 1000} for o in origins],
        "latency_ms": {"ams": {o: 2 for o in origins}, "fra": {o: 20 for o in origins}}}]})


def test_api_changes_are_back_after_a_restart_and_are_not_audited_twice(tmp_path: Path) -> None:
    path = tmp_path / "edge" / "overrides.json"
    first = TopologyStore(topology(), AuditLog(), path)
    first.set_capacity("web", "near", 55, reason="new hardware")
    first.set_health("web", "far", False, reason="drained for maintenance")
    first.set_latency("web", "fra", "near", float("inf"))     # no path any more
    first.set_latency("web", "ams", "far", 7.5)
    assert not [p for p in path.parent.iterdir() if p.name != "overrides.json"]   # no temporary left

    rec = Recorder()
    second = TopologyStore(topology(), AuditLog([rec]), path)
    assert second.origin("web", "near")["capacity_rps"] == 55
    assert second.origin("web", "far")["health_override"] is False
    spec = second.snapshot("web").spec
    assert "near" not in spec.latency_ms["fra"] and spec.latency_ms["ams"]["far"] == 7.5
    assert rec.records == []               # restoring is not a new change
    # Clearing a pin is kept as well.
    second.set_health("web", "far", None)
    assert TopologyStore(topology(), AuditLog(), path).origin("web", "far")["health_override"] is None


def test_overrides_for_what_the_topology_file_no_longer_has_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "overrides.json"
    store = TopologyStore(topology(("near", "far", "old")), AuditLog(), path)
    store.set_capacity("web", "old", 5)
    store.set_capacity("web", "near", 60)
    restored = TopologyStore(topology(("near", "far")), AuditLog(), path)
    assert restored.origin("web", "near")["capacity_rps"] == 60
    # the next save drops what no longer exists
    restored.set_capacity("web", "far", 900)
    assert json.loads(path.read_text())["capacity_rps"] == {"web": {"near": 60.0, "far": 900.0}}


@pytest.mark.parametrize("content,expected", [
    ("{not json", "cannot be read"),
    ('{"version": 1, "capacity_rps": {"web": {"near": "lots"}}}', "capacity_rps.web.near"),
    ('{"version": 9}', "version 9 unsupported"),
])
def test_an_unusable_overrides_file_stops_the_start_naming_it(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "overrides.json"
    path.write_text(content)
    with pytest.raises(OverridesError, match=expected) as e:
        TopologyStore(topology(), AuditLog(), path)
    assert str(path) in str(e.value) and "delete" in str(e.value)
    with pytest.raises(OverridesError):
        load_overrides(path)


def test_a_failed_save_keeps_the_change_and_counts_it(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    store = TopologyStore(topology(), AuditLog(), blocker / "overrides.json")
    before = REGISTRY.get_sample_value("opsloop_edge_overrides_save_failures_total") or 0.0
    store.set_capacity("web", "near", 33)
    assert store.origin("web", "near")["capacity_rps"] == 33
    assert REGISTRY.get_sample_value("opsloop_edge_overrides_save_failures_total") == before + 1


class SlowDisk:
    """The overrides file's write (temporary file, fsync, rename) held until released: a slow or hung disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = overrides_mod.replace_file

        def slow_replace(path: Path, data: bytes) -> None:
            self.entered.set()
            assert self.release.wait(60), "the slow write was never released"
            real(path, data)

        monkeypatch.setattr(overrides_mod, "replace_file", slow_replace)


def test_a_slow_overrides_write_does_not_hold_the_control_loops_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the file was written under the store's lock: while a disk took its time (fsync), every
    ``snapshot()`` of the control loop -- one per listener per tick -- waited for it, the loop stalled."""
    path = tmp_path / "overrides.json"
    store = TopologyStore(topology(), AuditLog(), path)
    disk = SlowDisk(monkeypatch)
    change = threading.Thread(target=store.set_capacity, args=("web", "near", 55), daemon=True)
    change.start()
    try:
        assert disk.entered.wait(30), "the API change never reached the disk"
        snap = ends_within(lambda: store.snapshot("web"), limit_s=20)   # the write still hangs
        assert next(o for o in snap.spec.origins if o.name == "near").capacity_rps == 55   # applied already
        assert change.is_alive()               # the API call returns once its change is on disk
    finally:
        disk.release.set()
        change.join(30)
    assert load_overrides(path).capacity_rps == {"web": {"near": 55}}


def test_changes_whose_writes_overlap_leave_the_newest_state_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second change made while the first one's write hangs: the file ends with both, never the first alone."""
    path = tmp_path / "overrides.json"
    store = TopologyStore(topology(), AuditLog(), path)
    disk = SlowDisk(monkeypatch)
    first = threading.Thread(target=store.set_capacity, args=("web", "near", 55), daemon=True)
    first.start()
    assert disk.entered.wait(30), "the first change never reached the disk"
    second = threading.Thread(target=store.set_health, args=("web", "far", False), daemon=True)
    second.start()
    disk.release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    saved = load_overrides(path)
    assert saved.capacity_rps == {"web": {"near": 55}} and saved.health == {"web": {"far": False}}
    assert not [p for p in path.parent.iterdir() if p.name != "overrides.json"]   # no temporary left


def test_changes_are_audited_at_the_time_they_took_effect_not_after_a_slow_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit record is written after the overrides file is saved; it was stamped then, so on a slow disk the
    decisions already made on a change came before its record (``audit search`` orders by time), and two changes
    whose saves raced could be audited in the reverse order of their effect."""
    clock = [1_700_000_000.0]
    monkeypatch.setattr(store_mod, "time", SimpleNamespace(time=lambda: clock[0]), raising=False)
    rec = Recorder()
    store = TopologyStore(topology(), AuditLog([rec]), tmp_path / "overrides.json")
    disk = SlowDisk(monkeypatch)
    first = threading.Thread(target=store.set_capacity, args=("web", "near", 55), daemon=True)
    first.start()
    assert disk.entered.wait(30), "the first change never reached the disk"
    clock[0] += 60                         # the disk takes a minute; a second change meanwhile
    second = threading.Thread(target=store.set_health, args=("web", "far", False), daemon=True)
    second.start()
    clock[0] += 60
    disk.release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    stamps = {r.action: r.time for r in rec.records}
    assert stamps == {"edge.topology.capacity": 1_700_000_000.0, "edge.topology.health": 1_700_000_060.0}
