"""Malformed records on a telemetry topic: each lands in the dead-letter topic with its reason, the good
records around it are processed, the worker keeps running and its dead-letter counter rises."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import read_topic, scrape_metric, unique, wait_until

pytestmark = pytest.mark.integration


def haproxy_sample(lb: str, sv: str, count: int, ts: float) -> dict:
    return {"name": "haproxy", "tags": {"host": lb, "proxy": "be", "sv": sv, "type": "server"},
            "fields": {"hrsp_2xx": count, "status": "UP", "weight": 10}, "timestamp": ts}


def test_malformed_records_are_deadlettered_and_good_ones_processed(stack, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    worker = start_worker(tmp_path, config, doc, stack)
    port = doc["stream"]["metrics_port"]
    lb = unique("dl")
    t0 = time.time() - 60
    bad_values = {
        "not-json": b"{this is not json",
        "wrong-type": orjson.dumps({"name": "haproxy", "tags": {"host": lb}, "fields": {"hrsp_2xx": [1]},
                                    "timestamp": t0}),
        "millis": orjson.dumps({"name": "haproxy", "tags": {"host": lb}, "fields": {"x": 1},
                                "timestamp": t0 * 1000}),
        "array": b"[1,2,3]",
        "empty": b"",
    }
    # A batch with one bad sample between two good ones: the good ones must still be processed.
    mixed_batch = orjson.dumps({"schema_version": 1, "metrics": [
        haproxy_sample(lb, "s1", 0, t0),
        {"name": "haproxy", "tags": {"host": lb}, "fields": {}, "timestamp": t0 + 5},
        haproxy_sample(lb, "s1", 100, t0 + 10),
    ]})
    before = scrape_metric(port, "opsloop_stream_deadlettered_total") or 0.0
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    try:
        for value in bad_values.values():
            producer.send(Topic.LB.value, key=lb.encode(), value=value)
        producer.send(Topic.LB.value, key=lb.encode(), value=mixed_batch)
        # Good records after the bad ones.
        producer.send(Topic.LB.value, key=lb.encode(), value=orjson.dumps(haproxy_sample(lb, "s2", 0, t0)))
        producer.send(Topic.LB.value, key=lb.encode(), value=orjson.dumps(haproxy_sample(lb, "s2", 50, t0 + 10)))
        producer.flush()
    finally:
        producer.close()
    try:
        # The good samples give rates 100/10 s and 50/10 s.
        s1 = wait_until(lambda: scrape_metric(port, "opsloop_lb_server_requests_per_second", {"lb": lb, "server": "s1"}),
                        timeout=90, what="rate of s1 from the mixed batch")
        s2 = wait_until(lambda: scrape_metric(port, "opsloop_lb_server_requests_per_second", {"lb": lb, "server": "s2"}),
                        timeout=30, what="rate of s2 after the bad records")
        assert s1 == pytest.approx(10.0)
        assert s2 == pytest.approx(5.0)

        expected = len(bad_values) + 1  # + the bad sample inside the batch

        def mine() -> list[dict]:
            docs = [orjson.loads(r.value) for r in read_topic(stack.kafka_bootstrap, Topic.DEADLETTER.value)]
            return [d for d in docs if d.get("key") == lb]

        dls = wait_until(lambda: (d := mine()) and len(d) >= expected and d, timeout=30, what="dead letters")
        assert len(dls) == expected
        reasons = " | ".join(d["reason"] for d in dls)
        assert "not JSON" in reasons
        assert "metrics.1.fields" in reasons          # the bad sample inside the batch, by position
        assert "milliseconds" in reasons
        assert "expected an object" in reasons
        assert "empty record" in reasons
        assert "hrsp_2xx" in reasons                  # the wrong-typed field is named
        assert all(d["source_topic"] == Topic.LB.value and d["offset"] is not None for d in dls)
        # The worker may also be catching up on other tests' garbage on the shared topic: at least ours.
        after = scrape_metric(port, "opsloop_stream_deadlettered_total") or 0.0
        assert after - before >= expected
        assert worker.running()
    finally:
        worker.stop()
