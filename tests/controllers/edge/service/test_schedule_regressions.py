"""What the seeded schedules (``test_schedule_loop.py``) found, one case each: a publish that failed taken
for the weights in force (the controller then damped from weights no actuator got, and the next decision
moved an edge two steps at once; the publisher never said it failed), and an origin drained by an
operator, or seen DOWN by an edge whose telemetry is fresh, kept its traffic while another edge's demand
was stale (the whole decision held, health with it)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.controllers.edge.service import kafka_io
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

    def __init__(self, name: str, max_step: float = 0.1) -> None:
        self.name = name
        spec = TopologySpec.model_validate({"listeners": [{
            "name": name, "backend": f"be_{name}", "edges": [{"name": "e1"}, {"name": "e2"}],
            "origins": [{"name": "near", "capacity_rps": 1000}, {"name": "mid", "capacity_rps": 1000},
                        {"name": "far", "capacity_rps": 1000}],
            "latency_ms": {e: {"near": 2, "mid": 5, "far": 30} for e in ("e1", "e2")}}]})
        self.t = T0
        self.store = TopologyStore(spec, AuditLog())
        self.book = DemandBook(clock=lambda: self.t)
        self.published: list[EdgeWeights] = []
        self.findings: list[Finding] = []
        self.offered: list[EdgeWeights] = []      # every record handed to publish, taken or not
        self.fail: set[str] | None = None
        self.max_step = max_step
        settings = ControllerSettings(interval_s=10.0, stale_after_s=STALE_S, max_step=max_step,
                                      relax_step=min(0.2, max_step), elasticity=0.0)
        self.loop = ControlLoop(self.store, self.book, settings, self.publish, clock=lambda: self.t)

    def publish(self, records: list[EdgeWeights], findings: list[Finding]) -> None:
        self.offered += records
        if self.fail is None:
            self.published += records
            self.findings += findings
            return
        taken = [r for r in records if r.edge in self.fail]
        self.published += taken
        raise PublishError("broker away", {f"{r.listener}|{r.edge}" for r in taken})

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
    monkeypatch.setattr(kafka_io, "KafkaProducer", lambda **kw: FakeProducer(broker, **kw))
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
