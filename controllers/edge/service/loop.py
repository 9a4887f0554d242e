"""One listener's control loop step, and the service-wide tick that runs every listener.

Per tick and listener: a consistent snapshot of the topology (with API overrides) and the newest
demand per edge → an :class:`~opsloop.controllers.edge.base.Observation` → ``EdgeController.step`` →
``Decision.records()`` to ``edge.weights`` (key ``listener|edge``; every tick, so actuators see
fresh decisions and can fail static when they stop; the version only moves when the weights do) and
findings to ``findings``; gauges updated.

Inputs age = the oldest of the edges' newest demand samples (an edge never heard from counts from
service start; a sample stamped beyond ``max_clock_skew_s`` ahead of this host's clock, which stepped
back, counts as stale): one silent edge makes the listener hold — the conservative reading of "stale
telemetry → hold". Until every edge has reported once, and while the inputs are not yet stale, the
loop waits instead of planning on zero demand.

Origin health = the file's ``healthy`` AND no edge with fresh telemetry sees the server
``DOWN``/``MAINT``; an API pin ``false`` drains it; a pin ``true`` overrides the file but not a load
balancer's DOWN (traffic sent to a server the LB marks DOWN goes nowhere) unless pinned with
``force``. Health does not go stale with the demand: with stale inputs the listener holds its weights
(fail static) but still moves the share off an origin known down now (a pin, the file, an edge whose
telemetry is fresh), and not onto one a record gone stale last saw DOWN.

Origin response time (what the controller predicts the clients' rebound from) = per origin, the
request-weighted mean over the fresh records of HAProxy's ``rtime`` less the edge→origin network
latency of the topology (the controller adds that itself); an origin no edge reports keeps its last
value, one never reported is taken as answering like the fastest reported (unloaded); with no
``rtime`` at all the controller plans without a rebound estimate.

The controller counts its hold-down and ramp-in in intervals, as in the simulator, where every tick
is exactly ``interval_s`` after the last. Live ticks wake a few milliseconds off their slot, so a
hold-down of 2 intervals ended at the second tick after a return or at the third, at random: the
controller's clock (``Observation.now``) therefore advances by whole intervals when a tick is within
a quarter interval of its slot (by the time elapsed otherwise: a stall, a clock step); the records'
``computed_at``, the inputs' age and the status keep the wall clock.

Each step of the controller is one measurement, as in the simulator: a tick that finds no demand
record newer than the last step's, with health, capacity and latency unchanged and the inputs not
yet stale and no returning origin's hold-down or ramp-in under way (those count intervals),
republishes the last decision (same version, fresh ``computed_at``) instead of stepping
the controller on the same measurement again. Collectors and the controller tick at their own
phases, so a tick regularly finds the record it already used; stepped on it, the controller read a
repeat as demand that did not change, its measured variability fell and so did the headroom it
plans for noise (with every 4th tick a repeat, the draws overloaded a noisy origin twice as often).
A record is the same measurement when its timestamp and readings (demand, and per server rate, up,
``rtime``) are: an at-least-once re-send, or one differing only in a server's status text, is no new
measurement; a record of the same timestamp with other readings (a collection round split over two
stream batches, the second with the servers the first lacked; a corrected record) is, and is decided
on -- the book keeps it, so a repeat would show the stored record beside a decision made on another.

A publish that failed is shown in the status until one succeeds (``publish_failure``: when, since
when, how many in a row, the version refused and the error, credentials masked); the other fields
stay those of the decision in force. So that a failing loop does not read as a fresh one, the status
also shows every listener's last attempted tick (``last_tick``: when, its outcome as counted in
``opsloop_edge_ticks_total``, the exception of a tick that raised, credentials masked; a failed
publish's error is in ``publish_failure``) and ``decision_age_s``, the seconds since the decision in
force was computed, taken when the status is read: it grows while the ticks fail.

Every record carries this instance's ``epoch`` (its start time in ms, above every epoch recovered
from ``edge.weights``): actuators order decisions by ``(epoch, version)``, so a restart that lost
the version sequence still moves the edge, and an older instance still running is refused.

On start, each edge whose last record was recovered (and names only origins of the topology) resumes
from its weights, and the first decision moves it at most ``max_step`` from them. An edge without one
(just added to the topology, its record lost) starts as a fresh edge does in the simulator and in the
final guard: all on its nearest origin healthy by the topology and the API's pins (the load balancers'
checks are not known yet: the first decision moves the share off a DOWN one at once), any reachable one
if none is; it is damped from there like the others. With no edge recovered the listener starts afresh:
its first decision is the plan's initial assignment, bounded only by the actuators' own ``max_step``.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.controllers.edge.base import Decision, Observation
from opsloop.controllers.edge.controller import EdgeController
from opsloop.controllers.edge.findings import decision_findings
from opsloop.controllers.edge.safety import nearest_rows, usable_mask
from opsloop.records import EdgeWeights, Mode
from opsloop.controllers.edge.service import metrics as M
from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.controllers.edge.service.kafka_io import PublishError
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.records import Finding
from opsloop.log import get_logger
from opsloop.records import EdgeDemand
from opsloop.redact import redact_credentials

log = get_logger("controller.edge")

Publish = Callable[[list[EdgeWeights], list[Finding]], None]
# a tick this close to a whole number of intervals after the last counts as exactly that many
SLOT_TOLERANCE = 0.25


@dataclass
class ListenerState:
    name: str
    edges: list[str]
    origins: list[str]
    controller: EdgeController
    last: Decision | None = None
    last_records: list[EdgeWeights] = field(default_factory=list)
    last_status: dict[str, Any] = field(default_factory=dict)
    open_findings: set[str] = field(default_factory=set)
    ticks: int = 0
    response_ms: dict[str, float] = field(default_factory=dict)  # last origin response time seen
    observed: tuple[Any, ...] = ()        # the inputs of the last observation (demand measurements, topology)
    stepped: tuple[Any, ...] | None = None  # ... and of the last one the controller stepped on
    spent: int | None = None   # the highest version a failed publish may still deliver (at-least-once)
    publish_failure: dict[str, Any] | None = None   # the last failed publish, until one succeeds (status)
    last_tick: dict[str, Any] | None = None   # the last tick attempted, whatever its outcome (status)


def measurement(rec: EdgeDemand) -> tuple[Any, ...]:
    """What of a demand record the controller reads: two records with these equal are one measurement
    (module docstring); a server's status text is not read (its ``up`` is)."""
    servers = tuple(sorted((o, s.rps, s.up, s.rtime_ms) for o, s in rec.origins.items()))
    return rec.timestamp, rec.demand_rps, servers


def start_weights(latency: np.ndarray, healthy: np.ndarray) -> np.ndarray:
    """[E, O]: each edge all on its nearest healthy reachable origin, else its nearest reachable one,
    else spread evenly: how a fresh edge starts (the simulator's default, the final guard's start for
    an edge without weights)."""
    rows = nearest_rows(latency, usable_mask(latency, healthy))
    none = ~rows.any(axis=1)
    rows[none] = nearest_rows(latency, np.isfinite(latency))[none]
    rows[~rows.any(axis=1)] = 1.0 / latency.shape[1]
    return rows


def origin_response_ms(records: list[tuple[int, EdgeDemand]], origins: list[str],
                       latency: np.ndarray, last: dict[str, float]) -> np.ndarray | None:
    """Per origin: the request-weighted mean of ``rtime − network latency`` over ``records``
    ((edge index, record) pairs, fresh only); updates ``last`` in place (module docstring)."""
    total = dict.fromkeys(origins, 0.0)
    weight = dict.fromkeys(origins, 0.0)
    for i, rec in records:
        for j, origin in enumerate(origins):
            state = rec.origins.get(origin)
            if state is None or state.rtime_ms is None or not np.isfinite(latency[i, j]):
                continue
            w = max(state.rps, 1e-6)  # an idle server's rtime still tells its unloaded speed
            total[origin] += w * max(0.0, state.rtime_ms - float(latency[i, j]))
            weight[origin] += w
    for origin in origins:
        if weight[origin] > 0:
            last[origin] = total[origin] / weight[origin]
    if not last:
        return None
    fastest = min(last.values())
    return np.array([last.get(o, fastest) for o in origins], dtype=float)


class ControlLoop:
    def __init__(self, store: TopologyStore, book: DemandBook, settings: ControllerSettings, publish: Publish,
                 recovered: dict[tuple[str, str], EdgeWeights] | None = None,
                 clock: Callable[[], float] = time.time, epoch: int | None = None) -> None:
        self.store = store
        self.book = book
        self.settings = settings
        self.publish = publish
        self.clock = clock
        self.started_at = clock()
        M.INTERVAL.set(settings.interval_s)
        self._last_tick: tuple[float, float] | None = None   # (wall clock, controller clock) of the last tick
        self.lock = threading.Lock()   # the API reads status while the loop writes it
        self.listeners: dict[str, ListenerState] = {}
        newest = max((r.epoch for r in (recovered or {}).values()), default=-1)
        self.epoch = epoch if epoch is not None else max(int(self.started_at * 1000), newest + 1)
        for name in store.listener_names():
            spec = store.snapshot(name).spec
            edges, origins = [e.name for e in spec.edges], [o.name for o in spec.origins]
            ctl = EdgeController(len(edges), len(origins), settings, origin_names=origins)
            self._recover(ctl, name, edges, origins, recovered or {})
            self.listeners[name] = ListenerState(name, edges, origins, ctl)

    def _recover(self, ctl: EdgeController, listener: str, edges: list[str], origins: list[str],
                 recovered: dict[tuple[str, str], EdgeWeights]) -> None:
        """Resume the last published version, and the weights of every edge whose record fits the current
        topology; an edge without one starts as a fresh edge does (module docstring)."""
        versions = [r.version for r in recovered.values() if r.listener == listener]
        if versions:
            ctl.version = max(versions)
        rows: list[np.ndarray | None] = []
        for edge in edges:
            rec = recovered.get((listener, edge))
            row = None if rec is None or not set(rec.weights) <= set(origins) \
                else np.array([rec.weights.get(o, 0.0) for o in origins], dtype=float)
            rows.append(row if row is not None and row.sum() > 0 else None)
        missing = [e for e, row in zip(edges, rows) if row is None]
        if len(missing) == len(edges):
            return   # nothing to resume: a fresh listener, its first decision the plan's initial assignment
        snap = self.store.snapshot(listener)
        _, _, latency, file_healthy = snap.spec.topology().arrays()
        healthy = np.array([_healthy(snap.health_override.get(o), bool(file_healthy[j]), False, o in snap.health_forced)
                            for j, o in enumerate(origins)], dtype=bool)
        start = start_weights(latency, healthy)
        ctl.weights = np.array([start[i] if row is None else row / row.sum() for i, row in enumerate(rows)])
        log.info("weights_recovered", listener=listener, version=ctl.version, started_fresh=missing)

    def control_time(self, now: float) -> float:
        """The controller's clock at a tick at wall time ``now`` (module docstring: whole intervals)."""
        if self._last_tick is None:
            control = now
        else:
            last_now, last_control = self._last_tick
            elapsed, interval = now - last_now, self.settings.interval_s
            slots = round(elapsed / interval)
            on_slot = slots >= 1 and abs(elapsed - slots * interval) <= SLOT_TOLERANCE * interval
            control = last_control + (slots * interval if on_slot else max(0.0, elapsed))
        self._last_tick = (now, control)
        return control

    def observe(self, state: ListenerState, now: float,
                control_now: float | None = None) -> tuple[Observation | None, dict[str, Any]]:
        snap = self.store.snapshot(state.name)
        spec = snap.spec
        topo = spec.topology()
        _, capacity, latency, file_healthy = topo.arrays()
        stale_after = self.settings.stale_after_s
        demand = np.zeros(len(state.edges))
        ages: list[float] = []
        seen = 0
        down: set[str] = set()
        last_down: set[str] = set()   # DOWN in a record gone stale: the last word on that server
        load: dict[str, float] = {o: 0.0 for o in state.origins}
        fresh: list[tuple[int, EdgeDemand]] = []
        readings: list[tuple[Any, ...] | None] = []
        for i, edge in enumerate(spec.edges):
            rec = self.book.get(spec.backend_name, edge.lb_name)
            readings.append(None if rec is None else measurement(rec))
            if rec is None:
                ages.append(max(0.0, now - self.started_at))
                continue
            seen += 1
            lead = rec.timestamp - now
            # stamped beyond the clock skew ahead of our clock (ours stepped back): of unknown age, and
            # every later record is refused as from the future, so it would read fresh for as long: stale
            age = max(0.0, -lead) if lead <= self.book.max_clock_skew_s else stale_after + lead
            ages.append(age)
            demand[i] = rec.demand_rps
            if age <= stale_after:
                fresh.append((i, rec))
            M.DEMAND.labels(state.name, edge.name).set(rec.demand_rps)
            for origin, o in rec.origins.items():
                if origin in load:
                    load[origin] += o.rps
                if not o.up:
                    (down if age <= stale_after else last_down).add(origin)
        age = max(ages) if ages else 0.0
        stale = age > stale_after
        if stale:
            down |= last_down   # the held weights' share moves off what is known down, never onto these
        healthy = np.array([_healthy(snap.health_override.get(o), bool(file_healthy[j]), o in down,
                                     o in snap.health_forced) for j, o in enumerate(state.origins)], dtype=bool)
        pinned_but_down = sorted(o for o in down
                                 if snap.health_override.get(o) is True and o not in snap.health_forced)
        status = {"demand_rps": dict(zip(state.edges, demand.tolist())),
                  "healthy": dict(zip(state.origins, healthy.tolist())),
                  "checks_down": sorted(down), "pinned_up_but_down": pinned_but_down,
                  "capacity_rps": dict(zip(state.origins, capacity.tolist())),
                  "origin_load_rps": load, "inputs_age_s": age, "edges_reporting": seen,
                  # which edge made the listener hold: stale or never heard from (edges_reporting counts those too)
                  "stale_edges": [e.name for e, a in zip(spec.edges, ages) if a > stale_after]}
        for o, rps in load.items():
            M.LOAD.labels(state.name, o).set(rps)
        for j, o in enumerate(state.origins):
            M.CAPACITY.labels(state.name, o).set(float(capacity[j]))
            M.HEALTHY.labels(state.name, o).set(1.0 if healthy[j] else 0.0)
        if seen < len(state.edges) and age <= stale_after:
            return None, status   # not every edge heard from yet: do not plan on zero demand
        state.observed = (tuple(readings), healthy.tobytes(), capacity.tobytes(), latency.tobytes())
        response = origin_response_ms(fresh, state.origins, latency, state.response_ms)
        if response is not None:
            status["origin_response_ms"] = dict(zip(state.origins, response.round(3).tolist()))
        # the pins are read now (the file as read at start: app.py), so health stays fresh when the demand goes
        # stale: the controller holds its weights but moves the share off an origin an operator drained
        return Observation(now=now if control_now is None else control_now, demand=demand, capacity=capacity,
                           latency=latency, healthy=healthy, inputs_age_s=age, origin_latency_ms=response,
                           health_age_s=0.0 if stale else None), status

    def tick(self) -> dict[str, Decision | None]:
        """Run one interval for every listener; a failing listener does not stop the others."""
        out: dict[str, Decision | None] = {}
        now = self.clock()
        control_now = self.control_time(now)
        for state in self.listeners.values():
            t0 = time.perf_counter()
            with self.lock:
                state.ticks += 1   # every attempt, one whose inputs could not be read too (``last_tick``)
            try:
                out[state.name] = self._tick_listener(state, now, control_now)
            except Exception as e:  # noqa: BLE001 - keep controlling the other listeners
                M.TICKS.labels(state.name, "error").inc()
                log.error("tick_failed", listener=state.name, error=f"{type(e).__name__}: {e}", exc_info=True)
                self._attempted(state, now, "error", redact_credentials(f"{type(e).__name__}: {e}")[:500])
                out[state.name] = None
            M.TICK_SECONDS.observe(time.perf_counter() - t0)
        M.LAST_TICK.set(self.clock())   # every interval run, whatever each listener's outcome (EdgeControllerStuck)
        return out

    def _tick_listener(self, state: ListenerState, now: float, control_now: float) -> Decision | None:
        obs, status = self.observe(state, now, control_now)
        if obs is None:
            M.TICKS.labels(state.name, "waiting").inc()
            with self.lock:
                state.last_status = {**status, "mode": "waiting", "reason": "waiting for demand from every edge",
                                     "tick": state.ticks, "version": state.controller.version}
            self._attempted(state, now, "waiting")
            return None
        if state.last is not None and state.observed == state.stepped \
                and obs.inputs_age_s <= self.settings.stale_after_s and not _returning(state.controller, control_now):
            return self._repeat(state, status, now, obs.inputs_age_s)
        stepped, open_findings = state.stepped, set(state.open_findings)
        state.stepped = state.observed
        # stepped on a copy, kept once published: a failed publish (or a step that raises) leaves the
        # controller at the weights the topic carries, not at ones no actuator got
        ctl = copy.deepcopy(state.controller)
        decision = ctl.step(obs)
        if state.spent is not None and decision.version <= state.spent:
            # that version may still reach an actuator naming the failed publish's weights: never reused
            ctl.version = decision.version = state.spent + 1
            decision.changed = True
        # built with validation (a model_copy is not validated): a record beyond a record's ranges (an epoch after
        # the year 9999 from a clock that far ahead) fails the tick naming the field, and reaches no actuator
        records = [EdgeWeights.build(**{**r.model_dump(), "epoch": self.epoch, "computed_at": now})
                   for r in decision.records(state.name, state.edges, state.origins)]
        findings = self._findings(state, decision, now)
        try:
            self.publish(records, findings)
        except Exception as e:  # noqa: BLE001 - Kafka away: this measurement is stepped on again next tick
            state.stepped, state.open_findings = stepped, open_findings
            self._unpublished(state, decision, e, now)
            if decision.changed:   # a new version: it may still arrive
                state.spent = max(state.spent or 0, decision.version)
            return None
        state.controller, state.spent = ctl, None
        self._export(state, decision, records)
        M.TICKS.labels(state.name, decision.mode.value).inc()
        with self.lock:
            state.last, state.last_records, state.publish_failure = decision, records, None
            state.last_status = {**status, "mode": decision.mode.value, "reason": decision.reason,
                                 "tick": state.ticks, "version": decision.version, "epoch": self.epoch,
                                 "changed": decision.changed, "repeated": False,
                                 "computed_at": now,
                                 "weights": {r.edge: r.weights for r in records},
                                 "shed_rps": float(decision.shed_rps.sum())}
        self._attempted(state, now, decision.mode.value)
        if decision.changed:
            log.info("weights_changed", listener=state.name, version=decision.version, mode=decision.mode.value,
                     reason=decision.reason[:300])
        return decision

    def _repeat(self, state: ListenerState, status: dict[str, Any], now: float, age: float) -> Decision | None:
        """No new measurement since the last step: the last decision again, fresh (module docstring)."""
        assert state.last is not None
        records = [r.model_copy(update={"computed_at": now, "inputs_age_s": age}) for r in state.last_records]
        open_findings = set(state.open_findings)
        try:
            self.publish(records, self._findings(state, state.last, now))   # open findings stay re-published
        except Exception as e:  # noqa: BLE001 - the same decision again next tick
            state.open_findings = open_findings
            self._unpublished(state, state.last, e, now)
            return None
        M.TICKS.labels(state.name, "repeated").inc()
        M.INPUTS_AGE.labels(state.name).set(age)
        with self.lock:
            state.last_records, state.publish_failure = records, None
            state.last_status = {**state.last_status, **status, "tick": state.ticks, "computed_at": now,
                                 "changed": False, "repeated": True}
        self._attempted(state, now, "repeated")
        return state.last

    def _attempted(self, state: ListenerState, now: float, outcome: str, error: str | None = None) -> None:
        """The status's ``last_tick``: ``outcome`` as counted in ``opsloop_edge_ticks_total``; ``error`` (masked)
        only for a tick that raised, a failed publish's being in ``publish_failure``."""
        with self.lock:
            state.last_tick = {"at": now, "tick": state.ticks, "outcome": outcome, "error": error}

    def _unpublished(self, state: ListenerState, decision: Decision, error: Exception, now: float) -> None:
        """A publish that failed: not the weights in force. Its version is spent all the same (records
        may still arrive, at-least-once: ``spent``, a version never names two sets of weights), and the
        rows the broker did acknowledge are the ones their edges now have."""
        ctl = state.controller
        ctl.version = max(ctl.version, decision.version)
        delivered = error.delivered if isinstance(error, PublishError) else set()
        if ctl.weights is not None and delivered:
            weights = ctl.weights.copy()
            for i, edge in enumerate(state.edges):
                if f"{state.name}|{edge}" in delivered:
                    weights[i] = decision.weights[i]
            ctl.weights = weights
        M.TICKS.labels(state.name, "publish_failed").inc()
        text = redact_credentials(f"{type(error).__name__}: {error}")[:500]   # the status is no log: masked here
        log.warning("publish_failed", listener=state.name, version=decision.version, error=text)
        with self.lock:
            last = state.publish_failure
            state.publish_failure = {"at": now, "since": now if last is None else last["since"],
                                     "consecutive": 1 if last is None else last["consecutive"] + 1,
                                     "version": decision.version, "error": text}
        self._attempted(state, now, "publish_failed")

    def _findings(self, state: ListenerState, decision: Decision, now: float) -> list[Finding]:
        found = decision_findings(decision, state.name, state.edges, now, include_cleared=True)
        out = []
        for f in found:
            if not f.cleared:
                out.append(f)
            elif f.id in state.open_findings:
                out.append(f)   # clear once, on the transition
        state.open_findings = {f.id for f in found if not f.cleared}
        return out

    @staticmethod
    def _export(state: ListenerState, decision: Decision, records: list[EdgeWeights]) -> None:
        for r in records:
            for origin, share in r.weights.items():
                M.WEIGHT.labels(state.name, r.edge, origin).set(share)
            M.FAIL_STATIC.labels(state.name, r.edge).set(
                1.0 if decision.mode in (Mode.HOLD, Mode.FALLBACK) else 0.0)
        M.VERSION.labels(state.name).set(decision.version)
        for mode in Mode:
            M.MODE.labels(state.name, mode.value).set(1.0 if mode is decision.mode else 0.0)
        M.INPUTS_AGE.labels(state.name).set(decision.inputs_age_s)
        M.SHED.labels(state.name).set(float(decision.shed_rps.sum()))

    def status(self) -> dict[str, Any]:
        """Per listener: the decision in force (or the wait), ``publish_failure``, ``last_tick`` and
        ``decision_age_s`` (module docstring); the age is taken now, so it grows while no tick succeeds."""
        now = self.clock()
        with self.lock:
            return {name: {**s.last_status,
                           "decision_age_s": None if "computed_at" not in s.last_status
                           else max(0.0, now - s.last_status["computed_at"]),
                           "last_tick": None if s.last_tick is None else dict(s.last_tick),
                           "publish_failure": None if s.publish_failure is None else dict(s.publish_failure)}
                    for name, s in self.listeners.items()}

    def weights(self, listener: str) -> list[dict[str, Any]]:
        with self.lock:
            state = self.listeners[listener]
            return [r.model_dump(mode="json") for r in state.last_records]


def _returning(ctl: EdgeController, now: float) -> bool:
    """A returning origin's hold-down or ramp-in under way: it moves with the intervals, not with the
    measurements, so such a tick steps the controller even on a measurement it has seen."""
    hold, s = ctl.hold_down, ctl.settings
    return bool((now < hold.until + s.slowstart_intervals * s.interval_s).any())


def _healthy(pin: bool | None, file_healthy: bool, checks_down: bool, forced: bool) -> bool:
    """An origin's health for the controller (see the module doc)."""
    if pin is None:
        return file_healthy and not checks_down
    if pin is False:
        return False
    return not checks_down or forced
