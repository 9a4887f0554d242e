"""The applier service end to end: real Kafka (`stack`), real HAProxy (`lab_edge`), `opsloop weights run`.

Publish EdgeWeights to ``edge.weights`` -> weights appear in HAProxy; the same version again -> no
change; a stale decision -> held + finding + metric; a fresh one clears it; HAProxy gone -> error
metric, no crash, and the pending decision lands once HAProxy is back.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.records import AuditRecord
from opsloop.records import Finding
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.stack import free_port

from tests.controllers.actuators.support import decision, start_haproxy, stop_haproxy
from tests.helpers import (findings_read, metrics_up, opsloop_process, read_topic, scrape_metric, unique,
                           wait_until, write_config)

pytestmark = pytest.mark.integration


def live(lab_edge) -> dict[str, int]:
    api = HaproxyAPI(lab_edge.admin_socket)
    return {s: api.get_weight(lab_edge.spec.backend, s)[0] for s in ("near", "far")}


def test_service_applies_decisions_from_kafka(stack, lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    edge = unique("ams")
    port = free_port()
    doc = {"kafka": {"bootstrap_servers": stack.kafka_bootstrap},
           "controllers": {"actuator": {
               "stale_after_s": 30, "store_dir": str(tmp_path / "store"), "metrics_port": port,
               "backoff_initial_s": 0.2, "backoff_max_s": 1.0,
               "reconcile_interval_s": None,  # the hand-set weight below must survive (noop proof)
               "targets": [{"edge": edge, "listener": "web", "kind": "haproxy", "socket": str(lab_edge.admin_socket),
                            "backend": lab_edge.spec.backend, "servers": {"near": "near", "far": "far"}}]}}}
    config = write_config(tmp_path / "opsloop.yaml", doc)
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")

    def publish(d) -> None:
        producer.send("edge.weights", key=f"{d.listener}|{d.edge}".encode(), value=d.encode()).get(timeout=10)

    # another edge's decision and a malformed record first: skipped / rejected, never applied here
    publish(decision(99, {"near": 0.1, "far": 0.9}, edge=unique("other")))
    producer.send("edge.weights", key=f"web|{edge}".encode(), value=b'{"version": "x"}').get(timeout=10)
    svc = opsloop_process("actuator", ["weights", "run", "--config", str(config), "--edge", edge], tmp_path / "svc",
                          ready=lambda: metrics_up(port))
    svc.start()
    try:
        wait_until(lambda: (scrape_metric(port, "opsloop_actuator_assigned_partitions") or 0) > 0, timeout=60,
                   what="partitions assigned")
        wait_until(lambda: (scrape_metric(port, "opsloop_actuator_rejected_records_total") or 0) >= 1, timeout=30,
                   what="malformed record rejected")

        def applies(result: str) -> float:
            return scrape_metric(port, "opsloop_actuator_applies_total", {"edge": edge, "result": result}) or 0

        publish(decision(1, {"near": 0.75, "far": 0.25}, edge=edge))
        wait_until(lambda: live(lab_edge) == {"near": 192, "far": 64}, timeout=30, what="v1 live in HAProxy")

        # same version again: nothing written (the hand-set weight survives), audited noop
        HaproxyAPI(lab_edge.admin_socket).set_weight(lab_edge.spec.backend, "far", 7)
        publish(decision(1, {"near": 0.75, "far": 0.25}, edge=edge))
        wait_until(lambda: applies("noop") == 1, timeout=30, what="noop")
        assert live(lab_edge)["far"] == 7

        # stale decision: held, fail-static metric, finding
        publish(decision(2, {"near": 0.5, "far": 0.5}, edge=edge, age_s=100))
        wait_until(lambda: scrape_metric(port, "opsloop_edge_fail_static", {"edge": edge}) == 1, timeout=30,
                   what="fail static")
        assert live(lab_edge) == {"near": 192, "far": 7}

        def findings(cleared: bool) -> list[Finding]:
            out = [f for _, f in findings_read(read_topic(stack.kafka_bootstrap, "findings"))]
            return [f for f in out if f.detector == "edge.fail_static" and f.where.get("edge") == edge
                    and f.cleared is cleared]

        opened = wait_until(lambda: findings(False), timeout=30, what="fail-static finding")
        assert opened[0].where == {"listener": "web", "edge": edge}

        # fresh decision: applied, fail static cleared
        publish(decision(3, {"near": 0.5, "far": 0.5}, edge=edge))
        wait_until(lambda: live(lab_edge) == {"near": 128, "far": 128}, timeout=30, what="v3 live")
        wait_until(lambda: scrape_metric(port, "opsloop_edge_fail_static", {"edge": edge}) == 0, timeout=30,
                   what="fail static cleared")
        wait_until(lambda: findings(True), timeout=30, what="finding cleared")

        # HAProxy gone: errors counted, service alive; back: the pending decision lands
        stop_haproxy(lab_edge)
        publish(decision(4, {"near": 0.25, "far": 0.75}, edge=edge))
        wait_until(lambda: (scrape_metric(port, "opsloop_actuator_errors_total",
                                          {"edge": edge, "kind": "unreachable"}) or 0) >= 2,
                   timeout=30, what="errors while HAProxy is down (retried)")
        assert svc.running()
        start_haproxy(lab_edge)
        wait_until(lambda: live(lab_edge) == {"near": 64, "far": 192}, timeout=30, what="v4 live after recovery")

        # every action is on the audit topic
        def audited() -> list[str]:
            recs = [AuditRecord.decode(r.value) for r in read_topic(stack.kafka_bootstrap, "audit")]
            return [r.result for r in recs if r.edge == edge]

        results = wait_until(lambda: (lambda r: r if r.count("applied") >= 3 else None)(audited()), timeout=30,
                             what="audit records")
        for expected in ("applied", "noop", "held", "failed"):
            assert expected in results, results
        assert scrape_metric(port, "opsloop_actuator_applied_version", {"edge": edge}) == 4
    finally:
        svc.stop()
        producer.close()
    # the store kept what was applied, for rollback
    lines = (tmp_path / "store" / edge / "web.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["version"] for x in lines] == [1, 3, 4]


def test_shadow_service_measures_and_touches_nothing(stack, lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    edge = unique("shadow")
    port = free_port()
    doc = {"kafka": {"bootstrap_servers": stack.kafka_bootstrap},
           "controllers": {"actuator": {
               "store_dir": str(tmp_path / "store"), "metrics_port": port,
               "targets": [{"edge": edge, "listener": "web", "kind": "haproxy", "socket": str(lab_edge.admin_socket),
                            "backend": lab_edge.spec.backend, "servers": {"near": "near", "far": "far"}}]}}}
    config = write_config(tmp_path / "opsloop.yaml", doc)
    svc = opsloop_process("actuator-shadow", ["weights", "run", "--config", str(config), "--mode", "shadow"],
                          tmp_path / "svc", ready=lambda: metrics_up(port))
    svc.start()
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    try:
        d = decision(1, {"near": 0.9, "far": 0.1}, edge=edge)
        producer.send("edge.weights", key=f"web|{edge}".encode(), value=d.encode()).get(timeout=10)
        diff = wait_until(lambda: scrape_metric(port, "opsloop_actuator_shadow_diff", {"edge": edge}), timeout=60,
                          what="shadow diff exported")
        assert diff == pytest.approx(0.4)  # live 0.5/0.5 vs decision 0.9/0.1
        assert scrape_metric(port, "opsloop_actuator_applies_total", {"edge": edge, "result": "shadow"}) == 1
        assert live(lab_edge) == {"near": 100, "far": 100}
    finally:
        svc.stop()
        producer.close()
    assert not (tmp_path / "store" / edge / "web.jsonl").exists()
