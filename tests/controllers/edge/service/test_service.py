"""The control service against a real Kafka: edge.demand in, edge.weights and findings out, restart recovery."""

from __future__ import annotations

import time

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.records import EdgeWeights
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.edge.service.config import EdgeServiceSettings
from opsloop.controllers.edge.service.kafka_io import recover_decisions
from opsloop.config import Settings
from opsloop.topics import Topic
from opsloop.records import EdgeDemand, OriginState
from tests.helpers import read_topic, unique, wait_until

pytestmark = pytest.mark.integration


def service_config(bootstrap: str, listener: str, edge: str) -> tuple[Settings, EdgeServiceSettings]:
    """One listener, one edge, a small near origin and a large far one; 1 s intervals, no API."""
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": bootstrap}})
    cfg = EdgeServiceSettings.model_validate({
        "interval_s": 1, "api": {"enabled": False}, "controller": {"stale_after_s": 3}, "overrides_file": None,
        "topology": {"listeners": [{
            "name": listener, "backend": f"be-{listener}", "edges": [{"name": edge}],
            "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 1000}],
            "latency_ms": {edge: {"near": 2, "far": 30}}}]}})
    return settings, cfg


def service(bootstrap: str, listener: str, edge: str) -> EdgeService:
    return EdgeService(*service_config(bootstrap, listener, edge)).start()


def records_for(bootstrap: str, listener: str) -> list[tuple[bytes, EdgeWeights]]:
    return [(r.key, EdgeWeights.decode(r.value)) for r in read_topic(bootstrap, Topic.EDGE_WEIGHTS.value)
            if orjson.loads(r.value).get("listener") == listener]


def test_demand_to_weights_findings_and_restart(kafka_bootstrap: str) -> None:
    listener, edge = unique("svc"), unique("lb")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)

    def send_demand(rps: float) -> None:
        rec = EdgeDemand(edge=edge, backend=f"be-{listener}", demand_rps=rps,
                         origins={"near": OriginState(rps=rps / 2), "far": OriginState(rps=rps / 2)},
                         timestamp=time.time())
        producer.send(Topic.EDGE_DEMAND.value, key=rec.key.encode(), value=rec.encode())
        producer.flush()

    svc = service(kafka_bootstrap, listener, edge)
    try:
        assert svc.consumer is not None and svc.consumer.assigned.wait(30)
        svc.tick()
        assert svc.loop.status()[listener]["mode"] == "waiting"
        send_demand(80.0)
        wait_until(lambda: svc.book.get(f"be-{listener}", edge) is not None, timeout=30, what="demand consumed")
        for _ in range(3):
            send_demand(80.0)
            svc.tick()
        recs = wait_until(lambda: len(r := records_for(kafka_bootstrap, listener)) >= 3 and r, timeout=30,
                          what="weights on edge.weights")
        assert {k for k, _ in recs} == {f"{listener}|{edge}".encode()}
        last = recs[-1][1]
        assert last.weights["near"] * 80 <= 40 * 1.05 and last.version >= 1
        # the demand stops: after stale_after_s the controller holds and says so on `findings`
        wait_until(lambda: (svc.tick(), svc.loop.status()[listener]["mode"] == "hold")[1], timeout=30,
                   interval=1.0, what="fail static")
        findings = wait_until(lambda: [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, Topic.FINDINGS.value)
                                       if listener in r.value.decode()], timeout=30, what="hold finding")
        assert any(f["detector"] == "edge.weights_held" and not f["cleared"] for f in findings)
        held_version = svc.loop.status()[listener]["version"]
        assert held_version == last.version
    finally:
        svc.stop()
    # restart: version and weights resumed from edge.weights
    recovered = recover_decisions(kafka_bootstrap)
    assert recovered[(listener, edge)].version == held_version
    svc2 = service(kafka_bootstrap, listener, edge)
    try:
        ctl = svc2.loop.listeners[listener].controller
        assert ctl.version == held_version
        assert ctl.weights[0, 0] == pytest.approx(last.weights["near"])
        assert svc2.consumer is not None and svc2.consumer.assigned.wait(30)
        send_demand(20.0)
        wait_until(lambda: svc2.book.get(f"be-{listener}", edge) is not None, timeout=30, what="demand consumed")
        svc2.tick()
        assert svc2.loop.status()[listener]["version"] >= held_version
    finally:
        svc2.stop()
        producer.close()


def test_a_record_that_is_no_demand_is_dead_lettered_and_the_next_good_one_read(kafka_bootstrap: str) -> None:
    """Garbage on edge.demand (not JSON; JSON with a negative rate) is refused, counted and kept on
    the dead-letter topic with the reason, the source topic, partition, offset and key, as the
    stream stage keeps its own; the good record behind it is read."""
    listener, edge = unique("svc"), unique("lb")
    key = f"be-{listener}|{edge}".encode()
    good = EdgeDemand(edge=edge, backend=f"be-{listener}", demand_rps=30.0,
                      origins={"near": OriginState(rps=30.0)}, timestamp=time.time())
    negative = good.encode().replace(b'"demand_rps":30.0', b'"demand_rps":-30.0')
    assert negative != good.encode()
    svc = service(kafka_bootstrap, listener, edge)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    try:
        assert svc.consumer is not None and svc.consumer.assigned.wait(30)
        for value in (b"{not json", negative, good.encode()):
            producer.send(Topic.EDGE_DEMAND.value, key=key, value=value)
        producer.flush()
        wait_until(lambda: svc.book.get(f"be-{listener}", edge) is not None, timeout=30, what="good demand read")
        assert svc.book.get(f"be-{listener}", edge).demand_rps == 30.0
        dls = wait_until(lambda: len(d := [orjson.loads(r.value) for r in
                                           read_topic(kafka_bootstrap, Topic.DEADLETTER.value)
                                           if r.key == key]) >= 2 and d, timeout=30, what="dead letters")
        assert [d["value"] for d in dls] == ["{not json", negative.decode()]
        assert all(d["stage"] == "edge-control" and d["source_topic"] == Topic.EDGE_DEMAND.value
                   and d["offset"] is not None and d["key"] == key.decode() for d in dls)
        assert "demand_rps" in dls[1]["reason"]
        assert svc.book.rejected == 2
    finally:
        svc.stop()
        producer.close()
