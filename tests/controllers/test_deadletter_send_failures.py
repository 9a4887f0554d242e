"""A controller's dead letter the broker refuses is counted (``opsloop_deadletter_send_failures_total``, by stage),
against a real Kafka: the dead-letter topic of this test's prefix takes records of at most 1024 bytes
(``max.message.bytes``), so a refused record of 4 KB leaves a dead letter the broker refuses (as a real one
over the topic's limit would be), while a small one is written. kafka-python's ``send`` returns at once and its
future fails later: before, nothing counted or even logged that failure, and the bad record was gone."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.config import KafkaSettings
from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop.topics import Topic
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.alerting import ensure_topics
from tests.helpers import captured_logs, create_topics, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

MAX_MESSAGE_BYTES = 1024
BIG = os.urandom(4096)   # not a finding, not UTF-8: base64 in the dead letter, which random bytes keep big


def failures(stage: str) -> float:
    return DEADLETTER_SEND_FAILURES.labels(stage)._value.get()


def small_deadletter_topic(bootstrap: str) -> KafkaSettings:
    """Settings with a fresh topic prefix whose dead-letter topic takes at most MAX_MESSAGE_BYTES per record."""
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=unique("dlfail") + ".")
    create_topics(bootstrap, kafka.topic(Topic.DEADLETTER), max_message_bytes=MAX_MESSAGE_BYTES)
    return kafka


def produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(topic, key=key, value=value)
        producer.flush()
    finally:
        producer.close()


def test_paging_counts_the_dead_letter_the_broker_refuses(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The small dead letter first, written; then the big one, refused. (The order once mattered: kafka-python's
    idempotent producer, its default, took a refused batch as fatal and failed every later send; the services'
    producers are not idempotent since, tests/core/test_service_producer.py.)"""
    kafka = small_deadletter_topic(kafka_bootstrap)
    findings = kafka.topic(Topic.FINDINGS)
    ensure_topics(kafka_bootstrap, findings)
    produce(kafka_bootstrap, findings, b"k-small", b"[1, 2]")
    before = failures("paging")
    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json"), kafka)
    svc._connect()
    try:
        with captured_logs() as logs:
            wait_until(lambda: (svc.step(), svc._caught_up)[1], timeout=60, what="paging caught up")
            svc._producer.flush()
            letters = wait_until(lambda: read_topic(kafka_bootstrap, kafka.topic(Topic.DEADLETTER)), timeout=30,
                                 what="the small dead letter written")
            assert failures("paging") == before
            produce(kafka_bootstrap, findings, b"k-big", BIG)
            wait_until(lambda: (svc.step(), failures("paging") > before)[1], timeout=60,
                       what="the refused dead letter counted")
            svc._producer.flush()
    finally:
        svc.close()
    assert failures("paging") == before + 1   # the refused one, once; the written one not
    assert [orjson.loads(r.value)["key"] for r in letters] == ["k-small"]
    assert [orjson.loads(r.value)["key"] for r in read_topic(kafka_bootstrap, kafka.topic(Topic.DEADLETTER))] == \
        ["k-small"]
    [line] = [ln for ln in logs.lines if ln.startswith("deadletter_failed")]
    assert "'stage': 'paging'" in line and "MessageSizeTooLarge" in line and f"'source_topic': '{findings}'" in line


def test_edge_control_counts_the_dead_letter_the_broker_refuses(kafka_bootstrap: str) -> None:
    kafka = small_deadletter_topic(kafka_bootstrap)
    publisher = DecisionPublisher(kafka)
    before = failures("edge-control")
    record = SimpleNamespace(topic=kafka.topic(Topic.EDGE_DEMAND), partition=0, offset=9, key=b"lb|ams1", value=BIG,
                             headers=[])
    try:
        publisher.deadletter(record, "edge.demand: not JSON")   # returns at once: the broker answers later
        publisher.producer.flush(timeout=30)
        wait_until(lambda: failures("edge-control") > before, timeout=30, what="the refused dead letter counted")
    finally:
        publisher.close()
    assert failures("edge-control") == before + 1
    assert read_topic(kafka_bootstrap, kafka.topic(Topic.DEADLETTER)) == []
