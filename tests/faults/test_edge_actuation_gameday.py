"""Game day of the actuation chain against real Kafka and a real HAProxy: the weight actuator service
(``ActuatorService``, its own consumer and producer) fed records a faulty controller side can produce.

* two controller instances publishing at once (a failover left the old one up): the actuator fences the older
  epoch (its decisions are refused, the edge follows the newer one) -- and says so. Before, the refusals were
  only "in a row" until the newer instance's next re-send (every tick) reset the count, so
  ``opsloop_actuator_refused_decisions`` went 1, 0, 1, 0 and its alert (``for: 2m``) never fired: an old
  instance publishing for good was silent. Now ``opsloop_actuator_fenced_writer`` is 1 while one does;
* a record keyed for this edge whose value names another edge was skipped without a word by this edge's
  actuator (the other edge's never decodes it: the key is not its own): lost, not counted, not dead-lettered.
  Now it is rejected like a bad record (counted, dead-lettered with the reason);
* HAProxy reloaded (weights back to its config) between two pushes: the last applied weights are put back by
  the reconcile, without a new version.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer
from prometheus_client import REGISTRY

from opsloop.audit.trail import AuditLog
from opsloop.config import KafkaSettings
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.records import EdgeWeights
from opsloop.topics import Topic
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from tests.controllers.actuators.support import ListSink, start_haproxy, stop_haproxy
from tests.helpers import captured_logs, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

OLD_EPOCH = int(time.time() * 1000) - 3_600_000     # the instance a failover left running
NEW_EPOCH = OLD_EPOCH + 1_800_000                   # its successor


def live(lab_edge) -> dict[str, int]:
    api = HaproxyAPI(lab_edge.admin_socket)
    return {s: api.get_weight(lab_edge.spec.backend, s)[0] for s in ("near", "far")}


def decide(edge: str, epoch: int, version: int, near: float) -> EdgeWeights:
    return EdgeWeights(version=version, epoch=epoch, listener="web", edge=edge, computed_at=time.time(),
                       weights={"near": near, "far": round(1 - near, 6)}, reason=f"epoch {epoch} v{version}")


class Rig:
    """One actuator service on its own topic prefix, stepped by the test."""

    def __init__(self, tmp_path: Path, bootstrap: str, lab_edge, **options: object) -> None:
        self.edge = unique("gd")
        self.kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=self.edge + ".")
        self.bootstrap = bootstrap
        cfg = ActuatorConfig(store_dir=tmp_path / "store", start_offset="earliest", backoff_initial_s=0.2,
                             backoff_max_s=1.0, **options,
                             targets=[{"edge": self.edge, "listener": "web", "kind": "haproxy",
                                       "socket": str(lab_edge.admin_socket), "backend": lab_edge.spec.backend,
                                       "servers": {"near": "near", "far": "far"}}])
        self.sink = ListSink()
        self.svc = ActuatorService(cfg, self.kafka, [self.edge], AuditLog([self.sink]), client_id=self.edge)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.svc.connect()

    def send(self, key: str, value: bytes) -> None:
        self.producer.send(self.kafka.topic(Topic.EDGE_WEIGHTS), key=key.encode(), value=value).get(timeout=10)

    def publish(self, d: EdgeWeights) -> None:
        self.send(f"{d.listener}|{d.edge}", d.encode())

    def until(self, fn, what: str, timeout: float = 60.0):
        """Step the service until ``fn`` holds."""
        return wait_until(lambda: (self.svc.step(), fn())[1], timeout=timeout, interval=0.05, what=what)

    def drain(self) -> None:
        """Step until every record published so far is polled and handled (what is pending applied)."""
        consumer = self.svc._consumer
        tps = [tp for tp in consumer.assignment()]
        ends = consumer.end_offsets(tps)
        self.until(lambda: all(consumer.position(tp) >= ends[tp] for tp in tps)
                   and all(s.pending is None for s in self.svc.slots.values()), "every record handled")

    def handled(self, epoch: int, version: int) -> str | None:
        """The audited result of the decision ``(epoch, version)``, None before it is handled."""
        found = [r.result for r in self.sink.records if r.version == version
                 and (f"epoch {epoch} v{version}" in r.reason or r.reason.startswith(f"version {version} (epoch {epoch})"))]
        return found[-1] if found else None

    def gauge(self, name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"edge": self.edge, "listener": "web"})

    def close(self) -> None:
        self.producer.close()
        self.svc.close()


@pytest.fixture
def rig(tmp_path: Path, kafka_bootstrap: str, lab_edge):
    lab_edge.start()
    made: list[Rig] = []

    def make(**options: object) -> Rig:
        made.append(Rig(tmp_path, kafka_bootstrap, lab_edge, **options))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_an_old_controller_still_publishing_is_fenced_and_said(rig, lab_edge) -> None:
    r = rig(stale_after_s=8.0, reconcile_interval_s=None)

    def newest_live() -> bool:
        r.publish(decide(r.edge, NEW_EPOCH, 1, 0.75))   # re-sent as the controller does each tick
        return live(lab_edge) == {"near": 192, "far": 64}
    r.until(newest_live, "the new instance's decision applied")
    assert live(lab_edge) == {"near": 192, "far": 64}
    r.drain()   # the re-sends above
    # both instances publish every tick: interleaved, each record read in a poll of its own
    with captured_logs() as logs:
        for v in range(50, 56):
            r.publish(decide(r.edge, OLD_EPOCH, v, 0.25))
            r.drain()
            assert r.handled(OLD_EPOCH, v) == "stale_version"
            assert r.gauge("opsloop_actuator_refused_decisions") == 1
            r.publish(decide(r.edge, NEW_EPOCH, 1, 0.75))   # the successor's re-send: a noop
            r.drain()
            assert r.gauge("opsloop_actuator_refused_decisions") == 0   # not "in a row": its alert cannot fire
            assert live(lab_edge) == {"near": 192, "far": 64}   # never flaps to the old instance's weights
            assert r.gauge("opsloop_actuator_fenced_writer") == 1
        # both in one poll: the older dropped for the newer before any apply, fenced all the same
        r.publish(decide(r.edge, OLD_EPOCH, 56, 0.25))
        r.publish(decide(r.edge, NEW_EPOCH, 1, 0.75))
        r.drain()
        assert live(lab_edge) == {"near": 192, "far": 64}
    said = [ln for ln in logs.lines if ln.startswith("fenced_writer")]
    assert len(said) == 1 and str(OLD_EPOCH) in said[0] and str(NEW_EPOCH) in said[0], said
    # the old instance stopped: the signal goes once no fenced decision came for stale_after_s (the successor
    # keeps re-sending, so the slot stays fresh meanwhile)
    def gone() -> bool:
        r.publish(decide(r.edge, NEW_EPOCH, 1, 0.75))
        return r.gauge("opsloop_actuator_fenced_writer") == 0
    r.until(gone, "fenced writer signal gone", timeout=60)
    assert r.gauge("opsloop_edge_fail_static") == 0


def test_a_decision_keyed_for_this_edge_but_naming_another_is_rejected_and_dead_lettered(rig, lab_edge) -> None:
    r = rig(reconcile_interval_s=None)
    other = unique("other")
    wrong = decide(other, NEW_EPOCH, 7, 0.1)
    rejected = REGISTRY.get_sample_value("opsloop_actuator_rejected_records_total") or 0.0
    r.send(f"web|{r.edge}", wrong.encode())
    r.until(lambda: (REGISTRY.get_sample_value("opsloop_actuator_rejected_records_total") or 0.0) > rejected,
            "the mis-keyed record counted as rejected", timeout=30)
    letters = wait_until(lambda: read_topic(r.bootstrap, r.kafka.topic(Topic.DEADLETTER)), timeout=30,
                         what="the dead letter")
    doc = orjson.loads(letters[0].value)
    assert other in doc["reason"] and r.edge in doc["reason"], doc["reason"]
    assert live(lab_edge) == {"near": 100, "far": 100}   # applied nowhere
    # the right record for this edge still applies
    r.publish(decide(r.edge, NEW_EPOCH, 8, 0.75))
    r.until(lambda: live(lab_edge) == {"near": 192, "far": 64}, "a well-keyed decision applied")


def test_a_haproxy_reload_between_two_pushes_is_reconciled_without_a_new_version(rig, lab_edge) -> None:
    r = rig(reconcile_interval_s=1.0, stale_after_s=600.0)
    r.publish(decide(r.edge, NEW_EPOCH, 1, 0.75))
    r.until(lambda: live(lab_edge) == {"near": 192, "far": 64}, "v1 live")
    stop_haproxy(lab_edge)
    start_haproxy(lab_edge)          # a reload: the config's weights (100/100) again
    wait_until(lambda: lab_edge.admin_socket.exists() and live(lab_edge), timeout=30, what="HAProxy back")
    r.until(lambda: live(lab_edge) == {"near": 192, "far": 64}, "v1 put back by the reconcile")
    assert [x.action for x in r.sink.records if x.result == "applied"][-1] == "edge.weights.reconcile"
