"""Detector agents in the real Faust worker against the real Kafka: findings on the topic and in /metrics,
state that survives SIGKILL (no second warm-up, no repeated "opened")."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from opsloop.records import Finding
from opsloop.records import metric
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from opsloop.streams.agents.stateful import STATE_TABLE
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import findings_read, read_topic, scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------------------ helpers
def iptables_round(hv: str, ts: float, ports: dict[str, bool]) -> bytes:
    """One iptables collector round of hypervisor ``hv`` (shape of collectors/iptables)."""
    samples = [metric("iptables_vm_port", {"protected": int(ok), "ingress_chain": int(ok), "backend": "legacy",
                                           **({} if ok else {"reason": "ingress chain missing"})},
                      {"host": hv, "port_id": port, "device": f"tap{port[:11]}", "vm": f"vm-{port}"}, ts)
               for port, ok in ports.items()]
    bad = sum(1 for ok in ports.values() if not ok)
    samples.append(metric("iptables_ruleset", {"fingerprint": "f" * 64, "base_fingerprint": "b" * 64, "rules": 40,
                                               "chains": 12, "backend": "legacy", "ports_expected": len(ports),
                                               "ports_protected": len(ports) - bad, "ports_unprotected": bad},
                          {"host": hv}, ts))
    samples.append(metric("iptables_software", {"version": "2:9.4.1"}, {"host": hv, "package": "neutron-common"}, ts))
    return encode_batch(samples)


def power_history(host: str, t0: float, n: int, rng: random.Random) -> bytes:
    return encode_batch(metric("ipmi_power", {"watts": 155.0 + rng.gauss(0, 1.5)},
                               {"host": host, "source": "dcmi", "generation": "gen3", "raw_capacity_tb": "96"},
                               t0 + 60 * i) for i in range(n))


def produce(bootstrap: str, records: list[tuple[Topic, str, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for topic, key, value in records:
            producer.send(topic.value, key=key.encode(), value=value)
        producer.flush()
    finally:
        producer.close()


def findings(bootstrap: str, finding_id: str) -> list[tuple[str, Finding]]:
    """(event header, finding) of every record of ``finding_id`` on the findings topic, in order."""
    out = []
    for r, f in findings_read(read_topic(bootstrap, Topic.FINDINGS.value)):
        if r.key == finding_id.encode():
            out.append((dict(r.headers or []).get("event", b"").decode(), f))
    return out


def findings_of(bootstrap: str, detector: str, **where: str) -> list[tuple[str, Finding]]:
    out = []
    for r, f in findings_read(read_topic(bootstrap, Topic.FINDINGS.value)):
        if f.detector == detector and all(f.where.get(k) == v for k, v in where.items()):
            out.append((dict(r.headers or []).get("event", b"").decode(), f))
    return out


def state_in_changelog(bootstrap: str, app_id: str, key: str) -> dict[str, Any] | None:
    """The latest value of ``key`` in the detector-state changelog topic."""
    latest = None
    for r in read_topic(bootstrap, f"{app_id}-{STATE_TABLE}-changelog"):
        if r.key == orjson.dumps(key):
            latest = orjson.loads(r.value) if r.value else None
    return latest


def committed_everything(bootstrap: str, group: str, topics: list[Topic]) -> bool:
    """Has consumer group ``group`` committed every record of ``topics``? (reads, never joins the group)"""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(t.value, p) for t in topics for p in (consumer.partitions_for_topic(t.value) or ())]
        ends = consumer.end_offsets(tps)
        return bool(tps) and all(ends[tp] == 0 or (consumer.committed(tp) or 0) >= ends[tp] for tp in tps)
    finally:
        consumer.close()


def detectors_config(tmp: Path, stack: Any, **detectors: Any) -> tuple[Path, dict[str, Any]]:
    config, doc = pipeline_config(tmp, stack)
    doc.setdefault("streams", {})["detectors"] = detectors
    return write_config(config, doc), doc


# -------------------------------------------------------------------------------------------- tests
def test_unprotected_port_pages_and_state_survives_sigkill(stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    config, doc = detectors_config(tmp_path, stack, anomaly={"series": [{"metric": "ipmi_power", "field": "watts"}]})
    app_id, port = doc["stream"]["app_id"], doc["stream"]["metrics_port"]
    hv, host = unique("hv"), unique("stor-g3")
    t0 = time.time() - 7200
    rng = random.Random(7)
    n_history = 60                                        # well past the 30-point warm-up

    worker = start_worker(tmp_path, config, doc, stack)
    try:
        produce(bootstrap, [(Topic.IPTABLES, hv, iptables_round(hv, t0, {"p-open": False, "p-safe": True})),
                            (Topic.IPMI, host, power_history(host, t0, n_history, rng))])

        # (1) A VM port without its chain: a critical finding on the topic and in /metrics.
        opened = wait_until(lambda: findings_of(bootstrap, "firewall.unprotected_port", hypervisor=hv),
                            timeout=90, what="firewall finding on the findings topic")
        assert [e for e, _ in opened] == ["opened"]
        first = opened[0][1]
        assert first.severity.value == "critical" and not first.cleared
        assert first.where == {"hypervisor": hv, "port": "p-open", "vm": "vm-p-open"}
        assert first.first_seen == t0 and "ingress chain missing" in first.explanation
        assert first.runbook.endswith("/firewall.md#firewall-unprotected-port") and first.dashboard == ""
        labels = {"detector": "firewall.unprotected_port", "hypervisor": hv, "port": "p-open"}
        assert wait_until(lambda: scrape_metric(port, "opsloop_finding_active", labels), timeout=30,
                          what="active finding gauge") == 1.0
        assert scrape_metric(port, "opsloop_firewall_ports", {"hypervisor": hv, "state": "unprotected"}) == 1.0
        assert scrape_metric(port, "opsloop_firewall_ports", {"hypervisor": hv, "state": "protected"}) == 1.0
        assert not findings_of(bootstrap, "firewall.unprotected_port", hypervisor=hv, port="p-safe")

        # The state reached the changelog (once per batch) and the offsets were committed.
        series_key = (f"anomaly-detector|ipmi_power.watts|generation=gen3,host={host},raw_capacity_tb=96,"
                      "source=dcmi")
        wait_until(lambda: (s := state_in_changelog(bootstrap, app_id, series_key)) and
                   s["detector"]["n"] == n_history, timeout=30, what="anomaly state in the changelog")
        fw_state = wait_until(lambda: state_in_changelog(bootstrap, app_id, f"firewall-detector|{hv}"), timeout=30,
                              what="firewall state in the changelog")
        assert len(fw_state["book"]["open"]) == 1
        wait_until(lambda: committed_everything(bootstrap, app_id, [Topic.IPTABLES, Topic.IPMI]), timeout=30,
                   what="committed offsets")
    finally:
        worker.kill()                                      # SIGKILL: no graceful shutdown

    # (2) Restarted with the same app id: state recovered from the changelog.
    worker = start_worker(tmp_path, config, doc, stack)
    try:
        spike_ts = t0 + 60 * n_history
        produce(bootstrap, [
            (Topic.IPTABLES, hv, iptables_round(hv, t0 + 600, {"p-open": False, "p-safe": True})),
            (Topic.IPMI, host, encode_batch([metric("ipmi_power", {"watts": 420.0},
                                                    {"host": host, "source": "dcmi", "generation": "gen3",
                                                     "raw_capacity_tb": "96"}, spike_ts)])),
        ])
        # No second warm-up: the very first point after the restart scores as an anomaly.
        spike = wait_until(lambda: findings_of(bootstrap, "anomaly.ipmi_power.watts", host=host), timeout=90,
                           what="anomaly finding after the restart")
        assert spike[0][0] == "opened" and spike[0][1].first_seen == spike_ts and spike[0][1].score >= 0.9
        assert spike[0][1].observed == 420.0 and abs(float(spike[0][1].expected) - 155.0) < 5.0
        # The second firewall round was processed (gauge shows its event time) ...
        wait_until(lambda: scrape_metric(port, "opsloop_firewall_report_timestamp_seconds", {"hypervisor": hv})
                   == t0 + 600, timeout=30, what="second firewall round processed")
        # ... and the open finding was not re-published as new: one "opened", first_seen unchanged.
        records = findings(bootstrap, first.id)
        assert [e for e, _ in records].count("opened") == 1
        assert all(f.first_seen == t0 for _, f in records)
        assert scrape_metric(port, "opsloop_finding_active", labels) == 1.0   # restored into the gauge
        # The port gets its chain back: the finding clears, on the topic and in /metrics.
        produce(bootstrap, [(Topic.IPTABLES, hv, iptables_round(hv, t0 + 1200, {"p-open": True, "p-safe": True}))])
        cleared = wait_until(lambda: [f for e, f in findings(bootstrap, first.id) if e == "cleared"], timeout=30,
                             what="cleared finding")
        assert cleared[0].cleared and cleared[0].first_seen == t0 and cleared[0].last_seen == t0 + 1200
        assert wait_until(lambda: scrape_metric(port, "opsloop_finding_active", labels) == 0.0, timeout=30,
                          what="gauge back to 0")
    finally:
        worker.stop()


def test_published_figures_come_out_of_the_worker(stack, tmp_path: Path) -> None:
    """Power cost per TB-year, netperf regression and Keystone p95/heavy hitters via Kafka and the worker
    (the figures of docs/sources.md)."""
    bootstrap = stack.kafka_bootstrap
    config, doc = detectors_config(tmp_path, stack, keystone={"p95_window_s": 60, "p95_min_requests": 10,
                                                              "heavy_window_s": 120, "heavy_pane_s": 60,
                                                              "heavy_min_total": 50})
    port = doc["stream"]["metrics_port"]
    tag = unique("figures")
    t0 = time.time() - 7200
    records: list[tuple[Topic, str, bytes]] = []
    for gen, watts, raw_tb in (("gen1", 248.0, 48), ("gen2", 205.0, 48), ("gen3", 155.0, 96)):
        host = f"{tag}-{gen}"
        records.append((Topic.IPMI, host, encode_batch(
            metric("ipmi_power", {"watts": watts}, {"host": host, "source": "dcmi", "generation": gen,
                                                    "raw_capacity_tb": str(raw_tb)}, t0 + 30 * i) for i in range(3))))
    target_set = f"{tag}-six-vms"
    results = [(8.42, t0), (8.40, t0 + 600), (3.51, t0 + 1200)]   # the published regression at 8 queues
    records.append((Topic.NETPERF, target_set, encode_batch(
        metric("netperf_throughput", {"mean_gbps": g, "failed_targets": 0},
               {"host": "bench", "target_set": target_set, "driver": "netperf", "test": "TCP_STREAM", "queues": "8"},
               ts) for g, ts in results)))
    ks = f"{tag}-keystone"
    rounds = []
    for i in range(12):   # 15 s rounds: small requests at p95 ~750 ms, one credential with 60 % of validations
        ts = t0 + 15 * i
        rounds += [metric("s3_frontend_requests", {"requests": 100.0, "small_requests": 100.0, "small_p50_ms": 600.0,
                                                   "small_p95_ms": 750.0}, {"host": ks}, ts),
                   metric("s3_frontend_credential", {"keystone_validations": 60.0}, {"host": ks,
                                                                                       "access_key": "AKIAHOT"}, ts),
                   metric("s3_frontend_credential", {"keystone_validations": 40.0}, {"host": ks,
                                                                                       "access_key": "_other"}, ts)]
    records.append((Topic.KEYSTONE, ks, encode_batch(rounds)))

    worker = start_worker(tmp_path, config, doc, stack)
    try:
        produce(bootstrap, records)
        cost = {gen: wait_until(lambda g=gen: scrape_metric(port, "opsloop_power_eur_per_usable_byte_year",
                                                            {"host": f"{tag}-{g}"}), timeout=90, what=f"{gen} cost")
                for gen in ("gen1", "gen2", "gen3")}
        per_tb = {gen: c * 1e12 for gen, c in cost.items()}   # exported per byte; the reference table is per TB
        assert per_tb == {"gen1": pytest.approx(29.10, abs=0.01), "gen2": pytest.approx(24.05, abs=0.01),
                          "gen3": pytest.approx(9.09, abs=0.01)}
        ratio = wait_until(lambda: scrape_metric(port, "opsloop_netperf_throughput_ratio",
                                                 {"target_set": target_set, "queues": "8"}), timeout=30,
                           what="netperf ratio")
        assert ratio == pytest.approx(3.51 / 8.41, rel=0.01)
        drop = wait_until(lambda: findings_of(bootstrap, "netperf.throughput_drop", target_set=target_set),
                          timeout=30, what="netperf drop finding")
        assert drop[0][0] == "opened" and drop[0][1].observed == pytest.approx(3.51)
        p95 = wait_until(lambda: scrape_metric(port, "opsloop_keystone_small_request_p95_window_seconds", {"host": ks}),
                         timeout=30, what="keystone p95 window")
        assert p95 == pytest.approx(0.750, rel=0.02)   # 750 ms on the wire, seconds exported
        hot = wait_until(lambda: findings_of(bootstrap, "keystone.heavy_hitter", host=ks), timeout=30,
                         what="heavy hitter finding")
        assert {f.where["credential"] for _, f in hot} == {"AKIAHOT"}
        assert scrape_metric(port, "opsloop_keystone_credential_share", {"host": ks, "credential": "AKIAHOT"}) \
            == pytest.approx(0.6)
        assert findings_of(bootstrap, "keystone.small_request_p95", host=ks)
        assert scrape_metric(port, "opsloop_finding_active", {"detector": "power.cost", "host": f"{tag}-gen3"}) == 1.0
    finally:
        worker.stop()
