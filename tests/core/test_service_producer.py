"""One record the broker refuses for good must not stop a service's producer (real broker).

kafka-python 3.0's producer is idempotent by default, and its idempotent producer takes any non-retriable error
of a batch (a record over the topic's ``max.message.bytes``, a topic it may not write, a timestamp the broker
refuses) as fatal: every later send, to any topic, fails until the process restarts. A dead letter too big for
the dead-letter topic then stopped the edge controller's weight decisions, the paging actuator's audit records and
the actuators' findings. The services' producers (``service_producer``) are not idempotent: at-least-once, one
request in flight so a retry keeps the order, duplicates left to the consumers (versions, finding ids).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError

from opsloop.config import KafkaSettings
from opsloop.controllers.edge.service.kafka_io import DecisionPublisher
from opsloop.kafka_clients import service_producer
from tests.helpers import create_topics, unique

pytestmark = pytest.mark.integration

LIMIT = 2000   # the small topic's max.message.bytes


@pytest.fixture
def topics(kafka_bootstrap: str) -> tuple[str, str]:
    small, plain = unique("refusing"), unique("plain")
    create_topics(kafka_bootstrap, small, max_message_bytes=LIMIT)
    create_topics(kafka_bootstrap, plain)
    return small, plain


def _refused_then_sent(producer: KafkaProducer, small: str, plain: str) -> None:
    refused = producer.send(small, value=b"x" * (4 * LIMIT))
    with pytest.raises(KafkaError):
        refused.get(timeout=30)
    # the next record, on another topic, is delivered
    meta = producer.send(plain, value=b"after the refusal").get(timeout=30)
    assert meta.topic == plain and meta.offset >= 0


FACTORIES: dict[str, Callable[[str], Any]] = {
    "service_producer": lambda bootstrap: service_producer(KafkaSettings(bootstrap_servers=bootstrap), "t"),
    "edge DecisionPublisher": lambda bootstrap: DecisionPublisher(bootstrap).producer,
}


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_record_the_broker_refuses_does_not_stop_later_sends(factory: str, kafka_bootstrap: str,
                                                               topics: tuple[str, str]) -> None:
    producer = FACTORIES[factory](kafka_bootstrap)
    try:
        _refused_then_sent(producer, *topics)
        _refused_then_sent(producer, *topics)   # and again: nothing left broken by the first
    finally:
        producer.close(timeout=5)


def test_the_library_default_is_what_broke(kafka_bootstrap: str, topics: tuple[str, str]) -> None:
    """The reason for the setting, kept honest: kafka-python's default producer is stopped by one refusal (when a
    kafka-python release fixes this, this test says so and the setting can be reconsidered)."""
    small, plain = topics
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        with pytest.raises(KafkaError):
            producer.send(small, value=b"x" * (4 * LIMIT)).get(timeout=30)
        with pytest.raises(KafkaError):
            producer.send(plain, value=b"after the refusal").get(timeout=30)
    finally:
        producer.close(timeout=5)
