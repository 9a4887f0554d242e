"""What the seeded schedules (``test_schedule_loop.py``) found, one case each: a publish that failed taken
for the weights in force (the controller then damped from weights no actuator got, and the next decision
moved an edge two steps at once; the publisher never said it failed), and an origin drained by an
operator, or seen DOWN by an edge whose telemetry is fresh, kept its traffic while another edge's demand
was stale (the whole decision held, health with it). And what was left open after them: ``/v1/status`` silent
about a failed publish, a corrected demand record for an interval already decided on half-taken (stored, not
decided on), and a restart missing one edge's record recovering no weights at all."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service import kafka_io
from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher, PublishError
from opsloop.controllers.edge.service.loop import ControlLoop
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.records import EdgeDemand, EdgeWeights, Finding, Mode, OriginState, Severity
from opsloop.topics import Topic
from tests.controllers.edge.service.test_schedule_loop import Broker, FakeProducer, Plan

T0 = 1_795_500_000.0
STALE_S = 30.0


class Rig:
    """One listener, edges ``e1``/``e2``, origins near (2 ms) / mid (5 ms) / far (30 ms); a publish that
    fails while ``fail`` is set, the broker having taken only the records of the edges in it."""

    def __init__(self, name: str, max_step: float = 0.1,
                 recovered: dict[tuple[str, str], EdgeWeights] | None = None, store: TopologyStore | None = None,
                 t: float = T0) -> None:
        self.name = name
        spec = TopologySpec.model_validate({"listeners": [{
            "name": name, "backend": f"be_{name}", "edges": [{"name": "e1"}, {"name": "e2"}],
            "origins": [{"name": "near", "capacity_rps": 1000}, {"name": "mid", "capacity_rps": 1000},
                        {"name": "far", "capacity_rps": 1000}],
            "latency_ms": {e: {"near": 2, "mid": 5, "far": 30} for e in ("e1", "e2")}}]})
        self.t = t
        self.store = store if store is not None else TopologyStore(spec, AuditLog())
        self.book = DemandBook(clock=lambda: self.t)
        self.published: list[EdgeWeights] = []
        self.findings: list[Finding] = []
        self.offered: list[EdgeWeights] = []      # every record handed to publish, taken or not
        self.fail: set[str] | None = None
        self.error = "broker away"
        self.max_step = max_step
        settings = ControllerSettings(interval_s=10.0, stale_after_s=STALE_S, max_step=max_step,
                                      relax_step=min(0.2, max_step), elasticity=0.0)
        self.loop = ControlLoop(self.store, self.book, settings, self.publish, recovered, clock=lambda: self.t)

    def publish(self, records: list[EdgeWeights], findings: list[Finding]) -> None:
        self.offered += records
        if self.fail is None:
            self.published += records
            self.findings += findings
            return
        taken = [r for r in records if r.edge in self.fail]
        self.published += taken
        raise PublishError(self.error, {f"{r.listener}|{r.edge}" for r in taken})

    def demand(self, edge: str, rps: float = 50.0, down: tuple[str, ...] = (), ts: float | None = None) -> None:
        self.book.update(EdgeDemand(edge=edge, backend=f"be_{self.name}", demand_rps=rps,
                                    timestamp=self.t if ts is None else ts,
                                    origins={o: OriginState(rps=0.0, up=o not in down)
                                             for o in ("near", "mid", "far")}))

    def tick(self, *edges: str, down: tuple[str, ...] = ()) -> None:
        self.t += 10.0
        for e in edges:
            self.demand(e, down=down)
        self.loop.tick()

    def last(self, edge: str) -> EdgeWeights:
        return [r for r in self.published if r.edge == edge][-1]

    def counted(self, outcome: str) -> float:
        return REGISTRY.get_sample_value("opsloop_edge_ticks_total", {"listener": self.name, "outcome": outcome}) \
            or 0.0


@pytest.mark.parametrize("taken", [(), ("e1",)])
def test_a_publish_that_failed_is_not_taken_for_the_weights_in_force(taken: tuple[str, ...]) -> None:
    """Before: the controller kept the weights of a decision the broker refused; the next tick repeated
    the old one and the one after moved the edges from the refused weights, two steps off what the
    actuators had (seed 0 step 70: ``the API serves e2 v13 as published; the topic never got it``)."""
    rig = Rig(f"unpublished{len(taken)}")
    for _ in range(3):
        rig.tick("e1", "e2")
    assert rig.last("e1").weights["near"] == pytest.approx(1.0)
    served = rig.loop.weights(rig.name)
    rig.store.set_capacity(rig.name, "near", 10.0)    # 100 req/s onto 10: shed, max_step a tick
    errors = rig.counted("error")
    rig.fail = set(taken)
    rig.tick("e1", "e2")
    rig.fail = None
    after_failure = rig.loop.weights(rig.name)
    for _ in range(4):
        rig.tick("e1", "e2")
    for edge in ("e1", "e2"):
        near = [r.weights["near"] for r in rig.published if r.edge == edge]
        moves = np.abs(np.diff(near))
        assert moves.max() <= rig.max_step + 1e-9, (edge, near)
        assert near[-1] < 0.7, (edge, near)           # and it did shed
    # no version names two sets of weights
    named: dict[tuple[str, int], dict[str, float]] = {}
    for r in rig.published:
        assert named.setdefault((r.edge, r.version), r.weights) == r.weights, r
    if not taken:
        assert after_failure == served                # the API serves what was published
    assert rig.counted("error") == errors and rig.counted("publish_failed") >= 1   # counted as what it is


def test_stale_inputs_after_a_failed_publish_hold_what_the_topic_carries_under_a_version_of_their_own() -> None:
    """The refused decision's records may still reach the topic (a flush that timed out): its version
    names its weights, so the held weights the topic carries go out under the next one. Before, the
    hold published the refused weights themselves, new weights on stale inputs."""
    rig = Rig("unpublished_then_stale")
    for _ in range(3):
        rig.tick("e1", "e2")
    held = {e: rig.last(e) for e in ("e1", "e2")}
    rig.store.set_capacity(rig.name, "near", 10.0)
    rig.fail = set()
    rig.tick("e1", "e2")
    rig.fail = None
    refused = rig.offered[-1]
    assert refused.version > held["e1"].version and refused.weights != held["e1"].weights
    rig.t += STALE_S                                 # the collectors go quiet
    rig.tick()
    for e in ("e1", "e2"):
        r = rig.last(e)
        assert r.mode is Mode.HOLD and r.weights == held[e].weights, r
        assert r.version > refused.version, (r.version, refused.version)


def test_a_refused_repeat_is_counted_as_a_failed_publish_not_a_controller_error() -> None:
    rig = Rig("unpublished_repeat")
    for _ in range(3):
        rig.tick("e1", "e2")
    errors, failed = rig.counted("error"), rig.counted("publish_failed")
    rig.fail = set()
    rig.tick()                          # no new measurement: the last decision again, refused
    rig.fail = None
    assert rig.counted("error") == errors and rig.counted("publish_failed") == failed + 1


def test_the_publisher_says_which_weights_records_the_broker_did_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a refused send, a nacked record or a flush that timed out were logged and the call
    returned, so the loop took the decision for published."""
    broker = Broker([T0])
    monkeypatch.setattr(kafka_io, "service_producer", lambda kafka, client_id, **kw: FakeProducer(broker, **kw))
    publisher = DecisionPublisher("127.0.0.1:9", flush_timeout_s=0.1)
    records = [EdgeWeights(version=3, listener="web", edge=e, weights={"a": 1.0}, computed_at=T0) for e in ("e1", "e2")]
    finding = Finding(detector="edge.weights_held", what="weights held", where={"listener": "web"},
                      severity=Severity.WARNING, observed=40.0, first_seen=T0, last_seen=T0)
    for plan, delivered in ((Plan("nack", 1), {"web|e1"}), (Plan("timeout", 1), {"web|e1"}),
                            (Plan("refuse", 0), set()), (Plan("nack", 0), set())):
        broker.plan, broker.sends = plan, 0
        with pytest.raises(PublishError) as e:
            publisher(records, [finding])
        assert e.value.delivered == delivered, plan
    broker.plan, broker.sends = Plan("nack", 2), 0   # only the finding refused: the decision stands
    publisher(records, [finding])
    broker.plan, broker.sends = Plan(), 0
    publisher(records, [finding])
    weights = [v for _, v in broker.topic(Topic.EDGE_WEIGHTS.value)]
    assert len(weights) == 1 + 1 + 2 + 2     # what each attempt got through


def test_an_origin_drained_while_the_demand_is_stale_gets_no_traffic() -> None:
    """Fail static holds the weights, not an origin an operator drained: before, the stale listener kept
    sending near its share (seed 3 step 37: ``on unusable origin {'near': 1.0, ...} [hold: stale
    inputs ...]``), the runbook's "pin it down so the controller stops sending it traffic" did nothing."""
    rig = Rig("drain_stale")
    for _ in range(3):
        rig.tick("e1", "e2")
    held = rig.last("e1")
    rig.t += STALE_S                                   # the collectors go quiet
    rig.tick()
    assert rig.last("e1").mode is Mode.HOLD and rig.last("e1").weights == held.weights
    rig.store.set_health(rig.name, "near", False, reason="drain")
    rig.tick()
    for edge in ("e1", "e2"):
        r = rig.last(edge)
        assert r.mode is Mode.HOLD and r.weights["near"] == 0.0, r
        assert "moved off near" in r.reason, r.reason


def test_an_origin_a_fresh_edge_sees_down_gets_no_traffic_while_another_edge_is_stale() -> None:
    """The share moves off it, and not onto an origin that the stale edge's last record saw DOWN."""
    rig = Rig("down_stale")
    for _ in range(3):
        rig.tick("e1", "e2", down=("mid",))          # mid DOWN: everything on near
    assert rig.last("e2").weights["near"] == pytest.approx(1.0)
    for _ in range(4):                                 # e2 silent: stale; e1 then sees near DOWN too
        rig.tick("e1", down=("mid",))
    rig.tick("e1", down=("near",))
    for edge in ("e1", "e2"):
        r = rig.last(edge)
        assert r.mode is Mode.HOLD and r.weights["near"] == 0.0, r
        assert r.weights["mid"] == 0.0, r              # e2's last word on mid was DOWN
        assert r.weights["far"] == pytest.approx(1.0), r


def test_a_record_stamped_beyond_the_clock_skew_ahead_of_a_clock_stepped_back_is_not_fresh() -> None:
    """The controller's clock steps back 10 minutes (NTP, a VM restored): the records in the book are
    now stamped in its future, every new one is refused as from the future, and the old ones read as
    0 s old. Before, the listener went on deciding as if its inputs were fresh, on demand frozen at the
    step: a capacity cut moved the weights (mode normal, a new version, inputs age 0) and nothing said
    the edge ran blind. Now such a record is stale: fail static, the weights held, a finding."""
    rig = Rig("clock_back")
    for _ in range(3):
        rig.tick("e1", "e2")
    held = {e: rig.last(e) for e in ("e1", "e2")}
    true_t = rig.t
    rig.t -= 600.0                                    # the controller's host clock steps back
    rig.store.set_capacity(rig.name, "near", 10.0)
    for _ in range(3):
        rig.t += 10.0
        true_t += 10.0
        for e in ("e1", "e2"):
            rig.demand(e, rps=80.0, ts=true_t)        # the collectors' clocks are right: refused, future
        rig.loop.tick()
    assert rig.book.rejected == 6
    for e in ("e1", "e2"):
        r = rig.last(e)
        assert r.mode is Mode.HOLD and r.reason.startswith("stale inputs"), r
        assert (r.version, r.weights) == (held[e].version, held[e].weights), r
    assert any(f.detector == "edge.weights_held" and not f.cleared for f in rig.findings[-2:])


SECRET = "s3cret-pw"
TOKEN = "a-test-token-for-the-edge-api"


def test_the_status_shows_a_failed_publish_until_one_succeeds() -> None:
    """Before: a publish that failed (the loop keeps the weights the topic carries, counts
    ``publish_failed``) left ``/v1/status`` as it was: the last good decision, nothing wrong to see. Now
    ``publish_failure`` says when it failed, since when, how many times in a row, which version and why
    (no credentials), the fields already there unchanged, and goes back to null at the next publish."""
    rig = Rig("status_failed")
    for _ in range(3):
        rig.tick("e1", "e2")
    ok = rig.loop.status()[rig.name]
    assert ok.get("publish_failure", "missing") is None
    rig.store.set_capacity(rig.name, "near", 10.0)       # a new decision, a new version: refused below
    rig.fail = set()
    rig.error = (f"2 of 2 edge.weights record(s) not acknowledged (status_failed|e1, status_failed|e2); flush: "
                 f"KafkaTimeoutError: kafka://edge:{SECRET}@kafka-1:9093 timed out")
    rig.tick("e1", "e2")
    since = rig.t
    rig.tick("e1", "e2")
    status = rig.loop.status()[rig.name]
    failure = status["publish_failure"]
    assert failure is not None, status
    assert (failure["consecutive"], failure["since"], failure["at"]) == (2, since, rig.t), failure
    assert failure["version"] > ok["version"], failure
    assert "KafkaTimeoutError" in failure["error"] and "not acknowledged" in failure["error"], failure
    assert SECRET not in str(status) and "edge:" not in failure["error"], failure
    # the fields that were there: all still there, still naming the decision in force
    assert set(ok) <= set(status) and (status["version"], status["weights"]) == (ok["version"], ok["weights"])
    # through the API, behind its token as every /v1 route
    api = EdgeApi(rig.store, TOKEN, rig.loop.status, rig.loop.weights)
    code, doc = api.dispatch("GET", "/v1/status", f"Bearer {TOKEN}", b"")
    assert code == 200 and doc[rig.name]["publish_failure"]["consecutive"] == 2 and SECRET not in str(doc)
    assert api.dispatch("GET", "/v1/status", None, b"")[0] == 401
    rig.fail = None
    rig.tick("e1", "e2")
    status = rig.loop.status()[rig.name]
    assert status["publish_failure"] is None and status["version"] > failure["version"], status
    # a repeat that fails shows too, and clears the same way
    rig.fail = set()
    rig.tick()
    assert rig.loop.status()[rig.name]["publish_failure"]["consecutive"] == 1
    rig.fail = None
    rig.tick()
    assert rig.loop.status()[rig.name]["publish_failure"] is None


def measured(rig: Rig, edge: str, rps: float, ts: float, status: str = "") -> None:
    rig.book.update(EdgeDemand(edge=edge, backend=f"be_{rig.name}", demand_rps=rps, timestamp=ts,
                               origins={o: OriginState(rps=rps if o == "near" else 0.0, status=status)
                                        for o in ("near", "mid", "far")}))


def test_a_corrected_record_for_an_interval_already_decided_on_is_decided_on() -> None:
    """A collection round split over two stream batches gives two records of one interval (one
    timestamp): the second has the servers the first lacked. Before, the book kept the second but the
    loop took the same timestamp for no new measurement and repeated the decision made on the first:
    the status showed 300 req/s at e1 next to a decision planned on 50 (near at 350/200, not shed). Now
    other readings under the same timestamp are a new measurement; a re-send of the same readings is not
    (at-least-once), nor one whose only difference is the servers' status text."""
    rig = Rig("corrected")
    rig.store.set_capacity(rig.name, "near", 200.0)
    for _ in range(4):
        rig.t += 10.0
        for e in ("e1", "e2"):
            measured(rig, e, 50.0, rig.t)
        rig.loop.tick()
    decided = {e: rig.last(e) for e in ("e1", "e2")}
    assert decided["e1"].weights["near"] == pytest.approx(1.0)
    stamp = rig.t
    measured(rig, "e1", 300.0, stamp)                   # the same interval, the round complete: 350 onto 200
    rig.t += 10.0
    d = rig.loop.tick()[rig.name]
    status = rig.loop.status()[rig.name]
    assert status["demand_rps"]["e1"] == 300.0 and status["repeated"] is False, status
    assert d is not None and d.version > decided["e1"].version, d
    near = sum(rig.last(e).weights["near"] * rps for e, rps in (("e1", 300.0), ("e2", 50.0)))
    assert near < 350.0 - 1.0, [rig.last(e).weights for e in ("e1", "e2")]   # shedding off near
    stepped = len(rig.published)
    for status_text in ("", "UP 1/3"):                  # the same readings again: no new measurement
        measured(rig, "e1", 300.0, stamp, status=status_text)
        rig.t += 5.0
        again = rig.loop.tick()[rig.name]
        assert again is not None and again.version == d.version
        assert rig.loop.status()[rig.name]["repeated"] is True
    assert [r.version for r in rig.published[stepped:]] == [d.version] * 4


def test_a_restart_missing_one_edges_record_recovers_the_others_and_starts_that_edge_as_a_fresh_one() -> None:
    """An edge just added to the topology (or its record lost) has nothing on ``edge.weights``. Before,
    recovery then took no weights at all: the first decision was the plan's initial assignment, bounded
    only by the actuators' own max_step (e1 from near 0.14 to 1.0 in one step with max_step 0.1). Now the
    edges with a record resume from it, and the missing one starts as a fresh edge does (as in the
    simulator and the final guard): all on its nearest healthy origin; the first decision is within
    max_step of both."""
    before = Rig("restart_missing")
    before.store.set_capacity(before.name, "near", 60.0)   # 100 req/s onto 60: shed
    for _ in range(10):
        before.tick("e1", "e2")
    held = before.last("e1")
    assert held.weights["near"] < 0.8, held
    before.store.set_capacity(before.name, "near", 1000.0)  # room again: all of it belongs on near
    rig = Rig("restart_missing", recovered={(before.name, "e1"): held}, store=before.store, t=before.t)
    rig.tick("e1", "e2")
    first = {e: rig.last(e) for e in ("e1", "e2")}
    for o in ("near", "mid", "far"):
        assert abs(first["e1"].weights[o] - held.weights[o]) <= rig.max_step + 1e-9, (held.weights, first["e1"])
    assert first["e2"].weights["near"] >= 1.0 - rig.max_step - 1e-9, first["e2"]
    assert first["e1"].version > held.version and first["e1"].epoch > held.epoch, first["e1"]
    rig.store.set_capacity(rig.name, "near", 60.0)   # the edge started fresh is damped as any other
    rig.tick("e1", "e2")
    for e in ("e1", "e2"):
        moved = max(abs(rig.last(e).weights[o] - first[e].weights[o]) for o in ("near", "mid", "far"))
        assert moved <= rig.max_step + 1e-9, (first[e], rig.last(e))
