"""Test support for the actuator tests: an audit sink that keeps records, decisions, actuators."""

from __future__ import annotations

import time
from pathlib import Path

from opsloop.audit.trail import AuditLog
from opsloop.records import AuditRecord

from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.controllers.actuators.store import WeightStore
from opsloop.records import EdgeWeights


class ListSink:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def submit(self, record: AuditRecord) -> None:
        self.records.append(record)

    @property
    def results(self) -> list[str]:
        return [r.result for r in self.records]


def decision(version: int, weights: dict[str, float], *, edge: str = "ams1", listener: str = "web",
             age_s: float = 0.0) -> EdgeWeights:
    return EdgeWeights(version=version, listener=listener, edge=edge, weights=weights,
                       computed_at=time.time() - age_s, reason=f"test decision {version}")


def haproxy_actuator(lab_edge, store_dir: Path, *, edge: str = "ams1", mode: str = "live", max_step: float = 1.0,
                     stale_after_s: float = 60.0) -> tuple[EdgeActuator, ListSink]:
    cfg = HaproxyTargetConfig(kind="haproxy", edge=edge, listener="web", socket=lab_edge.admin_socket,
                              backend=lab_edge.spec.backend, servers={"near": "near", "far": "far"})
    sink = ListSink()
    act = EdgeActuator(HaproxyTarget(cfg), edge, "web", WeightStore(store_dir, edge, "web"), AuditLog([sink]),
                       mode=mode, max_step=max_step, stale_after_s=stale_after_s)
    return act, sink


def stop_haproxy(lab_edge) -> None:
    """Stop the lab HAProxy and remove its admin socket (the actuator's target is gone)."""
    lab_edge.procs[-1].stop()
    lab_edge.admin_socket.unlink(missing_ok=True)


def start_haproxy(lab_edge) -> None:
    """Start the lab HAProxy again (config weights). On a shared machine another process may briefly
    hold the freed frontend port as a client port: wait for it rather than fail."""
    from opsloop.stack.process import port_in_use
    from tests.helpers import wait_until

    port = lab_edge.spec.frontend_port
    wait_until(lambda: not port_in_use("127.0.0.1", port), timeout=60, what=f"frontend port {port} free again")
    lab_edge.procs[-1].start()


def hide_socket(lab_edge) -> Path:
    """Remove the admin socket's path while HAProxy runs (a hard link keeps the inode to restore it)."""
    import os

    keep = lab_edge.admin_socket.with_suffix(".kept")
    os.link(lab_edge.admin_socket, keep)
    lab_edge.admin_socket.unlink()
    return keep


def restore_socket(lab_edge, keep: Path) -> None:
    keep.rename(lab_edge.admin_socket)
