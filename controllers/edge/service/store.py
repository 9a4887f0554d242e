"""The run-time source of truth: the topology as loaded, plus every change made through the API.

Thread-safe (the API server thread writes, the control loop reads a consistent snapshot per tick).
Every change is validated by the same functions as the topology file and the overrides file
(:func:`opsloop.controllers.edge.model.check_capacity`, :func:`~opsloop.controllers.edge.model.check_latency`: finite,
≥ 0, bounded; names must exist) and audited (``opsloop.audit.trail.AuditLog``) with before/after and the actor.
Health has an *override*: ``None`` follows the load balancers' checks (and the file's ``healthy``),
``False`` pins it down (an operator draining an origin), ``True`` pins it up over the file's
``healthy`` but not over a load balancer reporting the server DOWN -- unless ``force`` is set too
(an operator who knows the check is wrong). With an overrides file the changes survive a restart
(:mod:`opsloop.controllers.edge.service.overrides`): written after the change, outside the store's lock (a slow
disk's fsync held every ``snapshot()`` of the control loop before), by whichever writer comes first the newest
state (a write never puts an older state over a newer one); the API call returns once its change is on disk.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from opsloop.controllers.edge.model import check_capacity, check_latency
from opsloop.controllers.edge.service.config import ListenerSpec, TopologySpec
from opsloop.controllers.edge.service.overrides import Overrides, load_overrides, save_overrides
from opsloop.audit.trail import AuditLog
from opsloop.log import get_logger

log = get_logger("controller.edge.store")
SAVE_FAILURES = Counter("opsloop_edge_overrides_save_failures_total",
                        "Edge API changes applied but not written to the overrides file")

ACTOR = "api.edge"


class TopologyError(ValueError):
    """A change names an unknown listener/edge/origin or carries an invalid value (status 404/400)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ListenerSnapshot:
    spec: ListenerSpec
    health_override: dict[str, bool]   # origin -> pinned health
    health_forced: frozenset[str] = frozenset()  # origins pinned up even over a DOWN from the checks


def _checked(check: Any, field: str, value: Any) -> float:
    try:
        return float(check(field, value))
    except ValueError as e:
        raise TopologyError(str(e)) from None


class TopologyStore:
    def __init__(self, topology: TopologySpec, audit: AuditLog | None = None,
                 overrides_file: Path | None = None) -> None:
        self._topology = topology.model_copy(deep=True)
        self._overrides: dict[str, dict[str, bool]] = {lst.name: {} for lst in topology.listeners}
        self._forced: dict[str, set[str]] = {lst.name: set() for lst in topology.listeners}
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()   # one overrides write at a time, outside self._lock
        self._change_seq = 0                 # changes so far (under self._lock) ...
        self._saved_seq = 0                  # ... the newest of them on disk (under self._save_lock)
        self.audit = audit or AuditLog()
        self.changes = 0
        self.overrides_file = overrides_file
        self._saved = Overrides()
        if overrides_file is not None:
            self._restore(load_overrides(overrides_file))

    # -- reads ------------------------------------------------------------------------------
    def listener_names(self) -> list[str]:
        with self._lock:
            return [lst.name for lst in self._topology.listeners]

    def snapshot(self, listener: str) -> ListenerSnapshot:
        with self._lock:
            spec = self._listener(listener)
            return ListenerSnapshot(spec.model_copy(deep=True), dict(self._overrides[listener]),
                                    frozenset(self._forced[listener]))

    def topology(self) -> dict[str, Any]:
        with self._lock:
            doc = self._topology.model_dump(mode="json")
            for lst in doc["listeners"]:
                for origin in lst["origins"]:
                    origin["health_override"] = self._overrides[lst["name"]].get(origin["name"])
                    origin["health_forced"] = origin["name"] in self._forced[lst["name"]]
            return doc

    def origin(self, listener: str, origin: str) -> dict[str, Any]:
        with self._lock:
            o = self._origin(self._listener(listener), origin)
            return {"listener": listener, "origin": o.name, "capacity_rps": o.capacity_rps,
                    "healthy": o.healthy, "health_override": self._overrides[listener].get(origin),
                    "health_forced": origin in self._forced[listener]}

    # -- changes (audited) ------------------------------------------------------------------
    def set_capacity(self, listener: str, origin: str, capacity_rps: Any, reason: str = "",
                     actor: str = ACTOR) -> dict[str, Any]:
        value = _checked(check_capacity, "capacity_rps", capacity_rps)
        with self._lock:
            before = self._apply_capacity(listener, origin, value)
            at = self._changed()
        self._save()
        self._audit(actor, "edge.topology.capacity", listener, origin, before, {"capacity_rps": value}, reason, at)
        return self.origin(listener, origin)

    def set_health(self, listener: str, origin: str, healthy: Any, reason: str = "",
                   actor: str = ACTOR, force: Any = False) -> dict[str, Any]:
        if healthy is not None and not isinstance(healthy, bool):
            raise TopologyError(f"healthy: expected true, false or null (follow the checks), got {healthy!r}")
        if not isinstance(force, bool):
            raise TopologyError(f"force: expected true or false, got {force!r}")
        if force and healthy is not True:
            raise TopologyError(f"force: only with healthy true (pin an origin up over a DOWN from the load "
                                f"balancers' checks), got healthy {healthy!r}")
        with self._lock:
            before = self._apply_health(listener, origin, healthy, force)
            at = self._changed()
        self._save()
        after = {"health_override": healthy, **({"health_forced": True} if force else {})}
        self._audit(actor, "edge.topology.health", listener, origin, before, after, reason, at)
        return self.origin(listener, origin)

    def set_latency(self, listener: str, edge: str, origin: str, latency_ms: Any, reason: str = "",
                    actor: str = ACTOR) -> dict[str, Any]:
        value = _checked(check_latency, "latency_ms", latency_ms)
        ms = None if math.isinf(value) else value   # infinite: no path
        with self._lock:
            before = self._apply_latency(listener, edge, origin, ms)
            at = self._changed()
        self._save()
        self._audit(actor, "edge.topology.latency", listener, f"{edge}->{origin}", before,
                    {"latency_ms": ms}, reason, at, edge=edge)
        return {"listener": listener, "edge": edge, "origin": origin, "latency_ms": ms}

    # -- one change, applied and remembered for the overrides file (under the lock) ---------
    def _apply_capacity(self, listener: str, origin: str, value: float) -> dict[str, Any]:
        value = _checked(check_capacity, "capacity_rps", value)
        o = self._origin(self._listener(listener), origin)
        before = {"capacity_rps": o.capacity_rps}
        o.capacity_rps = value
        self._saved.capacity_rps.setdefault(listener, {})[origin] = value
        return before

    def _apply_health(self, listener: str, origin: str, healthy: bool | None, force: bool = False) -> dict[str, Any]:
        self._origin(self._listener(listener), origin)
        overrides, forced = self._overrides[listener], self._forced[listener]
        before = {"health_override": overrides.get(origin), **({"health_forced": True} if origin in forced else {})}
        if healthy is None:
            overrides.pop(origin, None)
        else:
            overrides[origin] = healthy
        if force and healthy is True:
            forced.add(origin)
        else:
            forced.discard(origin)
        return before

    def _apply_latency(self, listener: str, edge: str, origin: str, ms: float | None) -> dict[str, Any]:
        if ms is not None:
            ms = _checked(check_latency, "latency_ms", ms)
            ms = None if math.isinf(ms) else ms
        spec = self._listener(listener)
        if edge not in {e.name for e in spec.edges}:
            raise TopologyError(f"edge {edge!r} not in listener {listener!r}", 404)
        self._origin(spec, origin)
        row = spec.latency_ms.setdefault(edge, {})
        before = {"latency_ms": row.get(origin)}
        if ms is None:
            row.pop(origin, None)
        else:
            row[origin] = ms
        self._saved.latency_ms.setdefault(listener, {}).setdefault(edge, {})[origin] = ms
        return before

    # -- overrides file ---------------------------------------------------------------------
    def _changed(self) -> float:
        """Under the lock: count the change (written by :meth:`_save`, after the lock; it stands either way)
        and return when it took effect: its audit record's time (recorded after the save, which may be slow)."""
        self.changes += 1
        self._change_seq += 1
        return time.time()

    def _overlay(self) -> tuple[int, Overrides]:
        """Under the lock: every API change so far, a deep copy (written after the lock, changes go on)."""
        # Pinned health is exactly the API's pins (the file's own health lives in the topology).
        health = {name: dict(pins) for name, pins in self._overrides.items() if pins}
        forced = {name: sorted(origins) for name, origins in self._forced.items() if origins}
        return self._change_seq, self._saved.model_copy(deep=True, update={"health": health,
                                                                           "health_forced": forced})

    def _save(self) -> None:
        """Write the newest state to the overrides file, outside the store's lock: the control loop's
        snapshots do not wait for the disk. Under the save lock the newest state is taken, so a change whose
        write waited finds it written by a later one's (and a write that failed is made by the next change)."""
        if self.overrides_file is None:
            return
        with self._save_lock:
            with self._lock:
                seq, overlay = self._overlay()
            if seq <= self._saved_seq:
                return
            try:
                save_overrides(self.overrides_file, overlay)
                self._saved_seq = seq
            except OSError as e:
                SAVE_FAILURES.inc()
                log.error("overrides_not_saved", file=str(self.overrides_file), error=str(e),
                          consequence="the change applies now but a restart would undo it")

    def _restore(self, saved: Overrides) -> None:
        """Apply the overrides that still fit the topology file (not audited again); skip and name the others."""
        changes = ([(f"capacity {lst}/{o}", lambda lst=lst, o=o, v=v: self._apply_capacity(lst, o, v))
                    for lst, origins in saved.capacity_rps.items() for o, v in origins.items()]
                   + [(f"health {lst}/{o}", lambda lst=lst, o=o, h=h: self._apply_health(
                       lst, o, h, force=o in saved.health_forced.get(lst, [])))
                      for lst, pins in saved.health.items() for o, h in pins.items()]
                   + [(f"latency {lst}/{e}->{o}", lambda lst=lst, e=e, o=o, ms=ms: self._apply_latency(lst, e, o, ms))
                      for lst, edges in saved.latency_ms.items() for e, row in edges.items() for o, ms in row.items()])
        skipped = []
        for what, apply in changes:
            try:
                apply()
            except TopologyError as e:
                skipped.append(f"{what}: {e}")
        if changes:
            log.info("overrides_restored", file=str(self.overrides_file), applied=len(changes) - len(skipped),
                     skipped=len(skipped))
        for reason in skipped:
            log.warning("override_skipped", file=str(self.overrides_file), reason=reason)

    # -- helpers ----------------------------------------------------------------------------
    def _listener(self, name: str) -> ListenerSpec:
        try:
            return self._topology.listener(name)
        except KeyError:
            raise TopologyError(f"listener {name!r} not found (listeners: "
                                f"{[lst.name for lst in self._topology.listeners]})", 404) from None

    @staticmethod
    def _origin(spec: ListenerSpec, name: str):  # -> Origin
        for o in spec.origins:
            if o.name == name:
                return o
        raise TopologyError(f"origin {name!r} not in listener {spec.name!r} "
                            f"(origins: {[o.name for o in spec.origins]})", 404)

    def _audit(self, actor: str, action: str, listener: str, target: str, before: dict[str, Any],
               after: dict[str, Any], reason: str, at: float, edge: str | None = None) -> None:
        self.audit.record(time=at, actor=actor, action=action, target=f"edge-topology:{listener}/{target}",
                          listener=listener, edge=edge, before=copy.deepcopy(before), after=after,
                          reason=reason or "changed through the edge API", mode="live", result="applied")
