"""Malformed records on EVERY telemetry topic and on the paging actuator's findings topic: each one is dead-lettered (with its
source topic and reason) and counted, the good records after it are processed, nothing crashes.

The stream worker reads the five telemetry topics; the paging actuator reads ``findings``. Besides the
hand-written classics (not JSON, a JSON array, an empty value, a millisecond timestamp, one bad sample in
a good batch) each topic gets seeded random damage of a valid record (truncations, random bytes); the
expected number of dead letters is what ``opsloop.wire.parse_record`` rejects, computed here.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.records import Finding, Severity
from opsloop.records import metric
from opsloop.topics import Topic
from opsloop.wire import encode_batch, parse_record
from tests.alerting import am_url, ensure_topics, start_actuator, start_alertmanager, webhook_receiver
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import read_topic, scrape_metric, unique, wait_until, write_config

pytestmark = pytest.mark.integration

FUZZED_PER_TOPIC = 12


def good_records(topic: Topic, key: str, ts: float) -> list[bytes]:
    """Valid records of ``topic`` and (below) the gauge that shows they were processed."""
    if topic is Topic.IPMI:
        return [encode_batch([metric("ipmi_power", {"watts": 201.0}, {"host": key, "source": "dcmi"}, ts)])]
    if topic is Topic.IPTABLES:
        return [encode_batch([
            metric("iptables_vm_port", {"protected": 1, "ingress_chain": 1, "backend": "nft"},
                   {"host": key, "port_id": "p1", "device": "tapp1", "vm": "vm1"}, ts),
            metric("iptables_ruleset", {"fingerprint": "f" * 64, "base_fingerprint": "b" * 64, "rules": 10,
                                        "chains": 4, "backend": "nft", "ports_expected": 1, "ports_protected": 1,
                                        "ports_unprotected": 0}, {"host": key}, ts)])]
    if topic is Topic.NETPERF:
        return [encode_batch([metric("netperf_throughput", {"mean_gbps": 8.4, "failed_targets": 0},
                                     {"host": "bench", "target_set": key, "driver": "netperf", "test": "TCP_STREAM",
                                      "queues": "8"}, ts)])]
    if topic is Topic.KEYSTONE:
        return [encode_batch([metric("s3_frontend_requests", {"requests": 50.0, "small_requests": 40.0,
                                                              "small_p50_ms": 300.0, "small_p95_ms": 432.0},
                                     {"host": key}, ts)])]
    sample = {"host": key, "proxy": "be", "sv": "s1", "type": "server"}   # LB: a rate needs two rounds
    return [encode_batch([metric("haproxy", {"hrsp_2xx": n, "status": "UP", "weight": 10}, sample, ts + dt)])
            for n, dt in ((0, 0), (70, 10))]


PROCESSED: dict[Topic, tuple[str, Callable[[str], dict[str, str]], float]] = {
    Topic.IPMI: ("opsloop_power_watts", lambda k: {"host": k}, 201.0),
    Topic.IPTABLES: ("opsloop_firewall_ports", lambda k: {"hypervisor": k, "state": "protected"}, 1.0),
    Topic.NETPERF: ("opsloop_netperf_throughput_bytes_per_second", lambda k: {"target_set": k}, 8.4e9 / 8),   # 8.4 Gb/s on the wire
    Topic.KEYSTONE: ("opsloop_keystone_small_request_p95_seconds", lambda k: {"host": k}, 0.432),   # 432 ms on the wire
    Topic.LB: ("opsloop_lb_server_requests_per_second", lambda k: {"lb": k, "server": "s1"}, 7.0),
}


FUTURE_S = 30 * 86_400   # a month ahead: before 2100, so only the stream stage's clock check catches it


def classic_garbage(topic: Topic, key: str, ts: float) -> list[bytes]:
    name = {Topic.IPMI: "ipmi_power", Topic.IPTABLES: "iptables_ruleset", Topic.NETPERF: "netperf_throughput",
            Topic.KEYSTONE: "keystone_probe", Topic.LB: "haproxy"}[topic]
    good = {"name": name, "tags": {"host": key}, "fields": {"x": 1.0}, "timestamp": ts}
    return [
        b"{this is not json",
        b"[1,2,3]",
        b"",
        orjson.dumps({**good, "timestamp": ts * 1000}),                                   # milliseconds
        orjson.dumps({**good, "fields": {"x": [1]}}),                                     # wrong field type
        orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {}}, good]}),  # 1 bad of 3
        orjson.dumps({"schema_version": 99, "metrics": [good]}),                          # unknown version
        orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "timestamp": ts + FUTURE_S}]}),  # bad clock
    ]


def fuzzed_garbage(valid: bytes, rng: random.Random, n: int) -> list[bytes]:
    """Damaged copies of a valid record in which the wire parser finds no valid sample."""
    out: list[bytes] = []
    while len(out) < n:
        if rng.random() < 0.5:
            damaged = valid[: rng.randrange(0, len(valid))]
        else:
            damaged = bytearray(valid)
            for _ in range(rng.randint(1, 8)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            damaged = bytes(damaged)
        parsed = parse_record(damaged)
        if parsed.rejected and not parsed.metrics:   # a half-valid record would reach the handlers
            out.append(damaged)
    return out


def expected_deadletters(values: list[bytes], now: float) -> int:
    """One dead letter per record with anything wrong in it, however many of its samples were bad
    (stamped beyond the worker's default stream.max_clock_skew_s of 300 s counts as wrong)."""
    def bad(v: bytes) -> bool:
        p = parse_record(v)
        return bool(p.rejected) or any(m.timestamp > now + 300 for m in p.metrics)
    return sum(1 for v in values if bad(v))


def deadletters(bootstrap: str, key: str) -> list[dict[str, Any]]:
    docs = [orjson.loads(r.value) for r in read_topic(bootstrap, Topic.DEADLETTER.value, timeout_s=30)]
    return [d for d in docs if d.get("key") == key]


def test_every_telemetry_topic_deadletters_garbage_and_goes_on(stack, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    doc.setdefault("streams", {})["detectors"] = {"anomaly": {"enabled": False}}
    write_config(config, doc)
    worker = start_worker(tmp_path, config, doc, stack)
    port = doc["stream"]["metrics_port"]
    rng = random.Random(20261122)
    ts = time.time() - 30
    keys = {topic: unique(topic.value.split(".")[1]) for topic in PROCESSED}
    sent: dict[Topic, list[bytes]] = {}
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    try:
        for topic, key in keys.items():
            good = good_records(topic, key, ts)
            bad = classic_garbage(topic, key, ts) + fuzzed_garbage(good[0], rng, FUZZED_PER_TOPIC)
            sent[topic] = bad
            for value in bad + good:     # garbage first: the good records behind it must still be processed
                producer.send(topic.value, key=key.encode(), value=value)
        producer.flush()
    finally:
        producer.close()
    try:
        for topic, (gauge, labels, value) in PROCESSED.items():
            got = wait_until(lambda: scrape_metric(port, gauge, labels(keys[topic])), timeout=90,
                             what=f"good record on {topic.value} processed after the garbage")
            assert got == pytest.approx(value), (topic, got)
        for topic, key in keys.items():
            want = expected_deadletters(sent[topic], time.time())
            assert want == len(sent[topic])
            dls = wait_until(lambda: (d := deadletters(stack.kafka_bootstrap, key))
                             and sum(" rejected: " not in x["reason"] for x in d) >= want and d,
                             timeout=60, what=f"dead letters of {topic.value}")
            # One agent per topic decodes each record once (telemetry.lb feeds lb-rates and edge-demand
            # from the same decode), so each bad record gives one dead letter; a replay after
            # a rebalance (at-least-once) may repeat one, hence distinct ones are counted.
            # a sample valid on the wire that its detector cannot read (an ipmi_power without watts)
            # is dead-lettered by the detector besides: counted apart
            refused = [d for d in dls if " rejected: " in d["reason"]]
            distinct = {(d["partition"], d["offset"], d["reason"], str(d.get("value", d.get("value_b64"))))
                        for d in dls if d not in refused}
            assert len(distinct) == want, (topic, len(distinct), want)
            assert all(d["value"]["fields"] == {"x": 1.0} for d in refused), refused
            if topic is Topic.IPMI:
                assert refused and all("power-detector: " in d["reason"] for d in refused), dls
            assert {d["source_topic"] for d in dls} == {topic.value}
            assert all(d["reason"] and d["offset"] is not None for d in dls)
            reasons = " | ".join(d["reason"] for d in dls)
            for part in ("not JSON", "expected an object", "empty record", "milliseconds", "schema_version",
                         "stream.max_clock_skew_s"):
                assert part in reasons, (topic, part)
            counted = scrape_metric(port, "opsloop_stream_deadlettered_total", {"topic": topic.value}) or 0.0
            assert counted >= len(dls)
        assert worker.running()
    finally:
        worker.stop()


def finding_for(host: str) -> Finding:
    now = time.time()
    return Finding(detector="power.generation_deviation", what="power draw deviates from its generation",
                   where={"host": host, "generation": "gen3"}, observed=248.0, expected=155.0,
                   severity=Severity.CRITICAL, explanation="test", first_seen=now, last_seen=now)


def test_findings_topic_garbage_is_deadlettered_and_paging_goes_on(stack, tmp_path: Path) -> None:
    bootstrap = stack.kafka_bootstrap
    # The actuator's findings topic is configurable: a topic of its own keeps this garbage away from the
    # other tests that read the shared `findings` topic and decode every record on it.
    topic = unique("findings-fuzz")
    ensure_topics(bootstrap, topic, "audit")
    host = unique("fz-host")
    good = finding_for(host)
    valid = good.encode()
    doc = orjson.loads(valid)
    bad = [b"{nope", b"[]", b"", b"null", orjson.dumps({"detector": "x"}),
           orjson.dumps({**doc, "severity": "apocalyptic"}), orjson.dumps({**doc, "first_seen": "yesterday"})]
    bad += fuzzed_findings(valid, random.Random(7), 10)
    with webhook_receiver() as webhook:
        am = start_alertmanager(tmp_path / "am", webhook)
        actuator, port = start_actuator(tmp_path / "paging", bootstrap, am_url(am), topic=topic)
        try:
            wait_until(lambda: scrape_metric(port, "opsloop_paging_last_poll_timestamp_seconds"), timeout=60,
                       what="actuator polling")
            before = scrape_metric(port, "opsloop_paging_rejected_records_total") or 0.0
            producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
            try:
                for value in bad:   # same key as the good finding: same partition, garbage strictly before it
                    producer.send(topic, key=good.id.encode(), value=value)
                producer.send(topic, key=good.id.encode(), value=valid)
                producer.flush()
            finally:
                producer.close()
            pages = wait_until(lambda: [d for d in webhook.at("/page")
                                        if any(a["labels"].get("host") == host for a in d.body["alerts"])],
                               timeout=60, what="the good finding paged after the garbage")
            assert pages[0].body["status"] == "firing"
            wait_until(lambda: (scrape_metric(port, "opsloop_paging_rejected_records_total") or 0) - before
                       >= len(bad), timeout=30, what="rejected records counted")
            assert (scrape_metric(port, "opsloop_paging_rejected_records_total") or 0) - before == len(bad)
            dls = wait_until(lambda: (d := deadletters(bootstrap, good.id)) and len(d) >= len(bad) and d,
                             timeout=30, what="dead letters from the paging actuator")
            assert len(dls) == len(bad)
            assert all(d["source_topic"] == topic and d["stage"] == "paging" for d in dls)
            reasons = " | ".join(d["reason"] for d in dls)
            assert "not JSON" in reasons and "empty record" in reasons and "severity" in reasons
            assert actuator.running()
        finally:
            actuator.stop()
            am.stop()


def fuzzed_findings(valid: bytes, rng: random.Random, n: int) -> list[bytes]:
    """Damaged copies of a valid finding that do not decode as a finding."""

    out: list[bytes] = []
    while len(out) < n:
        damaged = bytearray(valid[: rng.randrange(1, len(valid))] if rng.random() < 0.5 else valid)
        for _ in range(rng.randint(0, 6)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            Finding.decode(bytes(damaged))
        except ValueError:
            out.append(bytes(damaged))
    return out
