"""The control loop without Kafka: demand book + topology store → decisions, records, findings, gauges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import REGISTRY

from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.controllers.edge.base import Decision
from opsloop.records import EdgeWeights, Mode
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.controllers.edge.service.loop import ControlLoop
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.audit.trail import AuditLog
from opsloop.records import EdgeDemand, OriginState

T0 = 1_795_000_000.0


def topology(listener: str, edges=("e1",), near_cap: float = 40.0) -> TopologySpec:
    return TopologySpec.model_validate({"listeners": [{
        "name": listener, "backend": f"be_{listener}", "edges": [{"name": e} for e in edges],
        "origins": [{"name": "near", "capacity_rps": near_cap}, {"name": "far", "capacity_rps": 1000}],
        "latency_ms": {e: {"near": 2, "far": 30} for e in edges}}]})


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Harness:
    def __init__(self, listener: str, edges=("e1",), recovered=None, stale_after_s: float = 5.0) -> None:
        self.listener = listener
        self.clock = Clock()
        self.store = TopologyStore(topology(listener, edges), AuditLog())
        self.book = DemandBook(clock=self.clock)
        self.published: list[tuple[list[EdgeWeights], list]] = []
        self.loop = ControlLoop(self.store, self.book,
                                ControllerSettings(interval_s=1.0, stale_after_s=stale_after_s),
                                lambda recs, finds: self.published.append((recs, finds)), recovered, self.clock)

    def demand(self, edge: str, rps: float, near_up: bool = True, ts: float | None = None) -> None:
        self.book.update(EdgeDemand(edge=edge, backend=f"be_{self.listener}", demand_rps=rps,
                                    origins={"near": OriginState(rps=rps / 2, up=near_up),
                                             "far": OriginState(rps=rps / 2)},
                                    timestamp=self.clock.t if ts is None else ts))

    def step(self, seconds: float = 1.0):
        self.clock.t += seconds
        return self.loop.tick()[self.listener]

    def gauge(self, name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)


def test_waits_for_demand_then_keeps_the_near_origin_within_capacity() -> None:
    h = Harness("wait")
    assert h.step() is None and h.published == []
    assert h.loop.status()["wait"]["mode"] == "waiting"
    near = []
    for _ in range(6):
        h.demand("e1", 80.0)
        d = h.step()
        assert d is not None
        near.append(d.weights[0, 0])
    # demand 80, near capacity 40: near ends at or under its capacity, the rest on far
    assert near[-1] * 80 <= 40 * 1.05
    assert near[-1] * 80 >= 40 * 0.8
    recs, _ = h.published[-1]
    assert [r.edge for r in recs] == ["e1"] and abs(sum(recs[0].weights.values()) - 1) < 1e-9
    assert h.gauge("opsloop_edge_weight", listener="wait", edge="e1", origin="near") == pytest.approx(near[-1])
    assert h.gauge("opsloop_edge_demand_requests_per_second", listener="wait", edge="e1") == 80.0
    assert h.gauge("opsloop_edge_origin_capacity_requests_per_second", listener="wait", origin="near") == 40.0
    assert h.gauge("opsloop_edge_decision_version", listener="wait") == recs[0].version
    assert h.gauge("opsloop_edge_mode", listener="wait", mode="normal") == 1.0


def test_unhealthy_origin_gets_zero_in_the_tick_that_sees_it() -> None:
    h = Harness("health")
    for _ in range(3):
        h.demand("e1", 20.0)
        h.step()
    assert h.loop.listeners["health"].last.weights[0, 0] > 0.5   # 20 req/s fit the near origin
    h.demand("e1", 20.0, near_up=False)                            # the LB's check says DOWN
    d = h.step()
    assert d.weights[0, 0] == 0.0 and d.changed
    assert h.loop.status()["health"]["checks_down"] == ["near"]
    h.demand("e1", 20.0)                                           # recovered ...
    h.store.set_health("health", "near", False, reason="drain for maintenance")  # ... but pinned down by API
    assert h.step().weights[0, 0] == 0.0
    h.store.set_health("health", "near", None)                     # follow the checks again
    h.demand("e1", 20.0)
    shares = []
    for _ in range(6):
        h.demand("e1", 20.0)
        shares.append(h.step().weights[0, 0])
    assert shares[-1] > 0.5 and shares == sorted(shares)           # traffic returns, monotonically


def test_stale_demand_holds_with_fail_static_and_a_finding_then_clears() -> None:
    h = Harness("stale", stale_after_s=3.0)
    h.demand("e1", 30.0)
    first = h.step()
    held = None
    for _ in range(5):                          # no new demand: the inputs age past stale_after_s
        held = h.step(seconds=1.0)
    assert held.mode is Mode.HOLD and held.version == first.version
    np.testing.assert_allclose(held.weights, first.weights)
    assert h.gauge("opsloop_edge_fail_static", listener="stale", edge="e1") == 1.0
    findings = [f for _, fs in h.published for f in fs]
    assert any(f.detector == "edge.weights_held" and not f.cleared for f in findings)
    h.demand("e1", 30.0)
    fresh = h.step()
    assert fresh.mode is not Mode.HOLD
    assert h.gauge("opsloop_edge_fail_static", listener="stale", edge="e1") == 0.0
    cleared = [f for f in h.published[-1][1] if f.cleared]
    assert [f.detector for f in cleared] == ["edge.weights_held"]


def test_silent_edge_makes_the_listener_hold_only_once_stale() -> None:
    h = Harness("twoedges", edges=("e1", "e2"), stale_after_s=3.0)
    h.demand("e1", 30.0)
    assert h.step() is None                     # e2 never reported, not yet stale: wait
    modes = []
    for _ in range(4):
        h.demand("e1", 30.0)
        d = h.step()
        if d is not None:
            modes.append(d.mode)
    # stale (e2 silent) and nothing to hold: a static fallback once, then it is held
    assert modes and modes[0] is Mode.FALLBACK and set(modes[1:]) <= {Mode.HOLD}
    assert h.gauge("opsloop_edge_fail_static", listener="twoedges", edge="e2") == 1.0
    # /v1/status names the edge that made the listener hold (edges_reporting counts stale edges too)
    assert h.loop.status()["twoedges"]["stale_edges"] == ["e2"]
    h.demand("e2", 30.0)
    h.demand("e1", 30.0)
    h.step()
    assert h.loop.status()["twoedges"]["stale_edges"] == []


def test_recovery_continues_version_and_weights() -> None:
    rec = EdgeWeights(version=41, listener="recover", edge="e1", weights={"near": 0.3, "far": 0.7},
                      computed_at=T0)
    h = Harness("recover", recovered={("recover", "e1"): rec})
    ctl = h.loop.listeners["recover"].controller
    assert ctl.version == 41
    np.testing.assert_allclose(ctl.weights, [[0.3, 0.7]])
    h.demand("e1", 80.0)
    d = h.step()
    assert d.version >= 41
    assert abs(d.weights[0, 0] - 0.3) <= 0.5 + 1e-9   # damped from the recovered weights (max_step)


def test_recovery_ignores_records_that_do_not_fit_the_topology() -> None:
    rec = EdgeWeights(version=7, listener="misfit", edge="e1", weights={"gone": 1.0}, computed_at=T0)
    h = Harness("misfit", recovered={("misfit", "e1"): rec})
    ctl = h.loop.listeners["misfit"].controller
    assert ctl.version == 7 and ctl.weights is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 500), st.booleans(), st.floats(0, 200), st.booleans()),
                min_size=1, max_size=12))
def test_never_an_all_zero_edge_and_nothing_on_a_down_origin(steps) -> None:
    h = Harness("prop")
    for demand, near_up, near_cap, far_pinned_down in steps:
        h.store.set_capacity("prop", "near", near_cap)
        h.store.set_health("prop", "far", False if far_pinned_down else None)
        h.demand("e1", demand, near_up=near_up)
        d = h.step()
        w = d.weights[0]
        assert w.sum() == pytest.approx(1.0) and (w >= 0).all() and w.max() > 0
        if not near_up and not far_pinned_down:
            assert w[0] == 0.0
        if near_up and far_pinned_down:
            assert w[1] == 0.0


def test_origin_response_time_reaches_the_controller_without_the_network_part() -> None:
    """``rtime`` per server (network included) → the origin's response time the controller predicts
    the clients' rebound from: request-weighted over edges, less the topology's path latency; an
    origin nobody reports keeps its last value."""
    h = Harness("rtime", edges=("e1", "e2"))
    backend = "be_rtime"

    def report(edge: str, near: tuple[float, float | None], far: tuple[float, float | None]) -> None:
        h.book.update(EdgeDemand(edge=edge, backend=backend, demand_rps=near[0] + far[0],
                                 origins={"near": OriginState(rps=near[0], rtime_ms=near[1]),
                                          "far": OriginState(rps=far[0], rtime_ms=far[1])},
                                 timestamp=h.clock.t))

    # near: 2 ms away, 30 req/s answered in 12 ms + 10 req/s in 42 ms → (30·10 + 10·40)/40 = 17.5
    report("e1", (30.0, 12.0), (10.0, 40.0))
    report("e2", (10.0, 42.0), (10.0, None))
    state = h.loop.listeners["rtime"]
    obs, status = h.loop.observe(state, h.clock.t)
    assert obs is not None and obs.origin_latency_ms is not None
    assert obs.origin_latency_ms.tolist() == pytest.approx([17.5, 10.0])
    assert status["origin_response_ms"] == {"near": pytest.approx(17.5), "far": pytest.approx(10.0)}
    h.step()
    assert state.controller.response.now.tolist() == pytest.approx([17.5, 10.0])
    # far no longer reported: its last value stays; near from the new records
    report("e1", (40.0, 5.0), (0.0, None))
    report("e2", (40.0, 7.0), (0.0, None))
    obs, _ = h.loop.observe(state, h.clock.t)
    assert obs.origin_latency_ms.tolist() == pytest.approx([4.0, 10.0])


def test_without_response_times_the_observation_has_none() -> None:
    h = Harness("nortime")
    h.demand("e1", 50.0)
    obs, status = h.loop.observe(h.loop.listeners["nortime"], h.clock.t)
    assert obs is not None and obs.origin_latency_ms is None and "origin_response_ms" not in status


@pytest.mark.parametrize("repeats", [False, True])
def test_hold_down_and_ramp_in_count_intervals_whatever_the_ticks_wake_up_jitter(repeats: bool) -> None:
    """A returning origin is held for ``hold_down_intervals`` ticks, then ramped in, and a second flap
    soon after is held ``hold_down_backoff`` times longer — as in the simulator, although live ticks wake
    a few ms off their slot (here each a little earlier than the last, which made a hold-down of 2
    intervals last 3 ticks), and although every other tick finds no new measurement (``repeats``: the
    hold-down counts intervals, not measurements); the records keep the wall clock as ``computed_at``."""
    listener = f"jitter{int(repeats)}"
    h = Harness(listener)

    def tick(k: int, near_up: bool = True, fresh: bool = False):
        h.clock.t = T0 + k + 0.05 - 0.001 * k        # slot k, woken 50 ms late, less each time
        if fresh or not (repeats and k % 2):
            h.demand("e1", 80.0, near_up=near_up)
        return h.loop.tick()[listener]

    k = 0
    for _ in range(4):
        k += 1
        tick(k)

    def flap() -> tuple[int, list[float]]:
        nonlocal k
        k += 1
        assert tick(k, near_up=False, fresh=True).weights[0, 0] == 0.0
        held, ramp = 0, []
        while True:
            k += 1
            d = tick(k, fresh=held == 0)             # near seen back up at once, then every other tick
            if "holding down" in d.reason:
                assert not ramp and d.weights[0, 0] == 0.0
                assert "holding down returning origin(s) near" in d.reason   # named as the topology names it
                held += 1
            elif "ramping in" in d.reason:
                ramp.append(float(d.weights[0, 0]))
            else:
                return held, ramp

    held1, ramp1 = flap()
    held2, ramp2 = flap()
    assert (held1, held2) == (2, 4)
    for ramp in (ramp1, ramp2):
        assert len(ramp) == 3 and 0 < ramp[0] and ramp == sorted(ramp)
    assert h.published[-1][0][0].computed_at == pytest.approx(h.clock.t)


def test_every_origin_unhealthy_holds_the_last_weights_and_pages_what_is_not_served() -> None:
    h = Harness("allbad")
    for _ in range(4):
        h.demand("e1", 80.0)
        last = h.step()
    h.store.set_health("allbad", "far", False, reason="drain far")   # far drained by the API ...
    h.demand("e1", 80.0, near_up=False)                              # ... and near DOWN by the LB's check
    d = h.step()
    # fail static: the weights in force, same version (an actuator re-applies nothing), never all-zero
    assert d.mode is Mode.HOLD and d.version == last.version and not d.changed
    np.testing.assert_allclose(d.weights, last.weights)
    assert "served fraction 0.000" in d.reason and "no healthy origin" in d.reason
    assert "nothing served at edge(s) [0] (80.0 req/s)" in d.reason
    recs, findings = h.published[-1]
    assert recs[0].mode is Mode.HOLD and sum(recs[0].weights.values()) == pytest.approx(1.0)
    shortfall = next(f for f in findings if f.detector == "edge.capacity_shortfall")
    assert shortfall.severity.value == "critical" and shortfall.observed == pytest.approx(80.0)
    assert "nothing served at edge(s) e1" in shortfall.explanation
    assert "the same fraction" not in shortfall.explanation
    assert any(f.detector == "edge.weights_held" and not f.cleared for f in findings)
    h.step()                                                         # no new record: the same, re-published
    assert h.published[-1][0][0].version == d.version and h.loop.status()["allbad"]["repeated"] is True
    assert sorted(f.detector for f in h.published[-1][1]) == ["edge.capacity_shortfall", "edge.weights_held"]
    # both back at once: served again (no other origin to wait on), both findings cleared once
    h.store.set_health("allbad", "far", None)
    h.demand("e1", 80.0)
    back = h.step()
    assert back.mode is Mode.NORMAL and back.shed_rps.sum() == 0.0, back.reason
    cleared = sorted(f.detector for f in h.published[-1][1] if f.cleared)
    assert cleared == ["edge.capacity_shortfall", "edge.weights_held"]


def test_noisy_demand_near_capacity_is_planned_with_headroom_for_its_variability() -> None:
    """Demand records shaped like the haproxy collector's (request rate per interval, split over the
    servers by the weights in force) with i.i.d. noise, sd 10 %, at 95 % of the near origin's capacity,
    through the live loop: the plan covers the noise's upper quantile (an uplift over the estimate, the
    near origin's share well below the whole it gets without noise, its planned load never above its
    capacity) and the draws overload it in at most 5 % of 100 intervals, the quantile's promise (seeded
    draws; 1–4 intervals on seeds 1–8)."""
    mean, capacity = 38.0, 40.0

    def run(sd: float) -> list[tuple[float, Decision]]:
        h = Harness(f"noise{int(sd * 100)}")
        rng = np.random.default_rng(5)
        share, out = 1.0, []
        for _ in range(112):
            rps = mean * max(0.0, 1.0 + sd * rng.standard_normal())
            h.book.update(EdgeDemand(edge="e1", backend=f"be_{h.listener}", demand_rps=rps,
                                     origins={"near": OriginState(rps=rps * share),
                                              "far": OriginState(rps=rps * (1 - share))}, timestamp=h.clock.t))
            d = h.step()
            out.append((rps, d))
            share = float(d.weights[0, 0])
        return out[12:]                      # once the variability window has seen the noise

    quiet = run(0.0)
    assert all(d.weights[0, 0] == 1.0 for _, d in quiet)       # 38 req/s fit 40 · (1 − 0.05) whole
    noisy = run(0.10)
    for _, d in noisy:
        assert "above the estimate (its variability)" in d.reason, d.reason
        assert d.weights[0, 0] * d.demand_estimate[0] <= capacity, d.reason
    assert np.mean([d.weights[0, 0] for _, d in noisy]) <= 0.95
    overloaded = sum(rps * float(d.weights[0, 0]) > capacity for rps, d in noisy)
    assert overloaded <= 0.05 * len(noisy), overloaded


def test_a_tick_without_a_new_measurement_repeats_the_last_decision_instead_of_stepping_on_it() -> None:
    """The collector and the controller tick at their own phases, so a tick often finds the demand
    record it already used. The controller steps once per measurement, as in the simulator: the same
    noisy measurements with a repeat after every third give the same decisions as without, and each
    repeated tick republishes the last decision (same version, fresh ``computed_at``)."""
    rng = np.random.default_rng(11)
    draws = [38.0 * (1.0 + 0.1 * rng.standard_normal()) for _ in range(60)]

    def run(listener: str, repeat_every: int) -> tuple[list[Decision], Harness]:
        h = Harness(listener)
        share, stepped = 1.0, []
        for i, rps in enumerate(draws):
            h.book.update(EdgeDemand(edge="e1", backend=f"be_{listener}", demand_rps=rps,
                                     origins={"near": OriginState(rps=rps * share),
                                              "far": OriginState(rps=rps * (1 - share))}, timestamp=h.clock.t))
            d = h.step()
            stepped.append(d)
            share = float(d.weights[0, 0])
            if repeat_every and i % repeat_every == repeat_every - 1:
                again = h.step()                                      # no new record since the last tick
                recs = h.published[-1][0]
                assert again is d and recs[0].version == d.version and recs[0].computed_at == h.clock.t
                assert h.loop.status()[listener]["repeated"] is True
        return stepped, h

    plain, _ = run("steps", 0)
    repeated, h = run("repeats", 3)
    assert len(h.published) == len(draws) + len(draws) // 3          # one record per tick all the same
    for a, b in zip(plain, repeated):
        np.testing.assert_allclose(b.weights, a.weights, atol=1e-12)
    assert len({round(float(d.weights[0, 0]), 6) for d in plain}) > 3   # the weights did move on the noise


def test_the_status_of_a_listener_whose_ticks_fail_says_so_and_ages() -> None:
    """Before: a tick that raised (inputs unreadable, the controller's step) or whose publish failed left
    ``tick``, ``computed_at`` and ``inputs_age_s`` of the last good one: ``/v1/status`` read as a fresh
    listener. Now ``last_tick`` names the last attempt (when, outcome, the error masked) and
    ``decision_age_s`` grows from the decision in force, also between two reads with no tick at all;
    the decision's own fields are unchanged, a failed publish's error stays in ``publish_failure`` only."""
    secret = "s3cret-pw"
    h = Harness("failing", stale_after_s=30.0)
    waiting = Harness("failing_wait", edges=("e1", "e2"))
    waiting.demand("e1", 20.0)
    waiting.step()
    w = waiting.loop.status()["failing_wait"]
    assert w["mode"] == "waiting" and w["decision_age_s"] is None
    assert w["last_tick"] == {"at": waiting.clock.t, "tick": 1, "outcome": "waiting", "error": None}
    for _ in range(2):
        h.demand("e1", 20.0)
        h.step()
    good = h.loop.status()["failing"]
    assert good["last_tick"] == {"at": h.clock.t, "tick": good["tick"], "outcome": good["mode"], "error": None}
    assert good["decision_age_s"] == 0.0 and good["publish_failure"] is None
    decided_at = h.clock.t

    def unreadable(*_: object) -> None:
        raise RuntimeError(f"demand book unreadable at kafka://edge:{secret}@kafka-1:9093")

    get, h.book.get = h.book.get, unreadable          # the inputs cannot be read
    for _ in range(3):
        h.demand("e1", 20.0)
        assert h.step() is None
    status = h.loop.status()["failing"]
    last = status["last_tick"]
    assert (last["at"], last["tick"], last["outcome"]) == (h.clock.t, good["tick"] + 3, "error"), last
    assert "RuntimeError: demand book unreadable" in last["error"] and secret not in str(status), last
    assert status["decision_age_s"] == pytest.approx(h.clock.t - decided_at) == 3.0
    # the decision in force as it was
    assert {k: status[k] for k in good if k not in ("last_tick", "decision_age_s")} \
        == {k: good[k] for k in good if k not in ("last_tick", "decision_age_s")}
    h.clock.t += 5.0                                   # no tick at all (a stuck loop): still older when read
    assert h.loop.status()["failing"]["decision_age_s"] == pytest.approx(8.0)
    h.book.get = get

    state = h.loop.listeners["failing"]
    step, state.controller.step = state.controller.step, lambda obs: 1 / 0   # the controller's step raises
    h.demand("e1", 25.0)
    h.step()
    status = h.loop.status()["failing"]
    assert status["last_tick"]["outcome"] == "error" and "ZeroDivisionError" in status["last_tick"]["error"]
    assert status["tick"] == good["tick"] and status["decision_age_s"] == pytest.approx(9.0)
    del state.controller.step

    def refused(recs: list[EdgeWeights], finds: list) -> None:
        raise RuntimeError(f"broker away: kafka://edge:{secret}@kafka-1:9093")

    publish, h.loop.publish = h.loop.publish, refused   # the publish fails
    h.demand("e1", 30.0)
    h.step()
    status = h.loop.status()["failing"]
    assert status["last_tick"] == {"at": h.clock.t, "tick": good["tick"] + 5, "outcome": "publish_failed",
                                   "error": None}, status   # the error: in publish_failure, not twice
    assert status["publish_failure"]["at"] == h.clock.t and secret not in str(status)
    assert status["decision_age_s"] == pytest.approx(10.0) and status["computed_at"] == decided_at
    h.loop.publish = publish
    h.demand("e1", 30.0)
    d = h.step()
    status = h.loop.status()["failing"]
    assert status["last_tick"] == {"at": h.clock.t, "tick": status["tick"], "outcome": d.mode.value, "error": None}
    assert status["decision_age_s"] == 0.0 and status["publish_failure"] is None and status["tick"] == good["tick"] + 6


def test_a_record_beyond_the_records_ranges_fails_the_tick_naming_it_and_is_never_published() -> None:
    """The loop set its epoch on each record with ``model_copy``, which validates nothing: an epoch after the year
    9999 in ms (a host clock that far ahead gives one: ``int(started_at * 1000)``) was published, and every
    actuator refused the record at decode. Now the tick fails naming the field (``last_tick``), nothing is
    published; at the last epoch a record carries, the records go out and decode."""
    last_epoch = 253_402_300_799_999   # 9999-12-31T23:59:59.999Z in ms (opsloop/records/edge.py), spelt out
    for epoch, published in ((last_epoch + 1, False), (last_epoch, True)):
        h = Harness(f"epoch{int(published)}")
        h.loop = ControlLoop(h.store, h.book, ControllerSettings(interval_s=1.0, stale_after_s=5.0),
                             lambda recs, finds: h.published.append((recs, finds)), None, h.clock, epoch=epoch)
        h.demand("e1", 20.0)
        decided = h.step()
        last = h.loop.status()[h.listener]["last_tick"]
        if not published:
            assert decided is None and h.published == [], h.published
            assert last["outcome"] == "error" and "epoch" in last["error"] and str(epoch) in last["error"], last
        else:
            [(records, _)] = h.published
            assert [EdgeWeights.decode(r.encode()).stamp for r in records] == [(epoch, decided.version)]


def test_every_interval_run_stamps_the_loops_liveness_whatever_its_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics answers from its own thread: a hung loop still scrapes, with its last gauges. The last interval's
    time (and the interval, the alert's yardstick) is what EdgeControllerStuck reads: stamped by every tick —
    waiting for demand, deciding, or a listener whose tick raised."""
    h = Harness("alive")
    assert h.gauge("opsloop_edge_interval_seconds") == 1.0
    h.step()                                   # waiting for demand
    assert h.gauge("opsloop_edge_last_tick_timestamp_seconds") == h.clock.t
    h.demand("e1", 20.0)
    assert h.step() is not None                # a decision
    assert h.gauge("opsloop_edge_last_tick_timestamp_seconds") == h.clock.t

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in one listener's tick")

    monkeypatch.setattr(h.loop, "_tick_listener", broken)
    assert h.step() is None                    # counted an error, the loop goes on
    assert h.gauge("opsloop_edge_last_tick_timestamp_seconds") == h.clock.t
