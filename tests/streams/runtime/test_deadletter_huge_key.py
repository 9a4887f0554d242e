"""A refused record with a 900 KiB key still leaves a dead letter on the topic (real worker, real broker).

The dead letter's body cuts the key to DEADLETTER_KEY_BYTES (``key_truncated``, ``key_bytes``), but both stream
paths (``streams/runtime/app.py``'s batch agent: telemetry.lb; ``streams/agents/stateful.py``'s detectors
agent: telemetry.ipmi) sent it with the record's whole key as the Kafka key: key plus body went past the
producer's 1,000,000 bytes, the send failed (``deadletter_send_failed``) and the bad record left no trace.
Before (old code): the live test times out waiting for the dead letters; the unit test fails on the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.records.deadletter import DEADLETTER_KEY_BYTES, deadletter_key
from opsloop.topics import Topic
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import read_topic, unique, wait_until

HUGE_KEY = 900 * 1024
# not UTF-8: the body carries 64 KiB of it as base64 (87 kB), the most a dead letter's value takes
BAD_VALUE = b"\xff" * 90_000


def test_the_kafka_key_of_a_dead_letter_is_cut_as_its_body_cuts_it() -> None:
    assert deadletter_key(None) is None
    assert deadletter_key(b"") == b""
    assert deadletter_key(b"k" * DEADLETTER_KEY_BYTES) == b"k" * DEADLETTER_KEY_BYTES   # at the bound: whole
    assert deadletter_key(b"k" * HUGE_KEY) == b"k" * DEADLETTER_KEY_BYTES


@pytest.mark.integration
def test_a_record_with_a_900_kib_key_is_dead_lettered_by_both_stream_agents(stack: Any, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    worker = start_worker(tmp_path, config, doc, stack)
    prefix = unique("huge-key")
    keys = {topic: f"{prefix}-{topic.name}-".encode().ljust(HUGE_KEY, b"k") for topic in (Topic.LB, Topic.IPMI)}
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all", max_request_size=2 ** 20)
    try:
        for topic, key in keys.items():
            producer.send(topic.value, key=key, value=BAD_VALUE)
        producer.flush()
    finally:
        producer.close()

    def ours() -> dict[str, tuple[bytes, dict[str, Any]]]:
        found = {}
        for r in read_topic(stack.kafka_bootstrap, Topic.DEADLETTER.value):
            body = orjson.loads(r.value)
            if str(body.get("key", "")).startswith(prefix):
                found[body["source_topic"]] = (r.key, body)
        return found if len(found) == len(keys) else {}

    try:
        found = wait_until(ours, timeout=90, what="a dead letter for each record with a 900 KiB key")
        assert worker.running()
    finally:
        worker.stop()
    for topic, key in keys.items():
        kafka_key, body = found[topic.value]
        assert kafka_key == key[:DEADLETTER_KEY_BYTES]
        assert (body["key_truncated"], body["key_bytes"], body["key"]) == (True, HUGE_KEY,
                                                                           key[:DEADLETTER_KEY_BYTES].decode())
        assert body["reason"].startswith("not JSON") and body["truncated"] is True and body["value_b64"]
