"""A dead-letter topic without metadata (not created, on a broker that does not auto-create) costs a service one
blocked ``send`` a minute, not one per dead letter.

Before, every ``send_deadletter`` blocked the producer's ``max_block_ms`` (5 s in the controllers) waiting for the
topic's metadata and then counted the dead letter lost: under a stream of bad records the service stalled 5 s per
record. Now the first timeout is logged (``deadletter_failed`` with its consequence), the producer's dead letters of
the next minute are counted lost at once without a send, and the topic is tried again after it. The state is the
producer's: another producer (a restarted client) sends at once.

Real Kafka of the ``stack`` fixture for the blocking producer, each test its own topic prefix.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from kafka.errors import KafkaTimeoutError

from opsloop import kafka_clients
from opsloop.config import KafkaSettings
from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop.kafka_clients import send_deadletter, service_producer
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic
from tests.helpers import CountingProducer, captured_logs, create_topics, read_topic, unique

log = get_logger("test.deadletter")


@pytest.fixture(autouse=True)
def fresh_log_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_clients, "DEADLETTER_LOST_LOG", Sampled(60.0), raising=False)


def failures(stage: str) -> float:
    return DEADLETTER_SEND_FAILURES.labels(stage)._value.get()


def dead_letter(producer: Any, kafka: KafkaSettings, offset: int, stage: str = "paging") -> None:
    send_deadletter(producer, kafka, "not JSON", source_topic=kafka.topic(Topic.FINDINGS), partition=0, offset=offset,
                    key=b"k", value=b"{", stage=stage, log=log, value_is="record")


@pytest.mark.integration
def test_a_dead_letter_topic_without_metadata_blocks_one_send_a_minute_not_one_per_record(
        kafka_bootstrap: str) -> None:
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("nodl") + ".")
    deadletters = kafka.topic(Topic.DEADLETTER)
    real = service_producer(kafka, unique("dl"), linger_ms=5, max_block_ms=2000, request_timeout_ms=5000)
    # a broker that does not auto-create: the metadata request must not ask it to (kafka-python 3.0.12 drops the
    # producer's allow_auto_create_topics=False on its way to the cluster metadata that builds the request)
    real._metadata.config["allow_auto_create_topics"] = False
    producer = CountingProducer(real, deadletters)
    before = failures("paging")
    try:
        with captured_logs() as logs:
            for offset in range(5):
                dead_letter(producer, kafka, offset)
        assert producer.sends == 1, f"{producer.sends} dead-letter sends blocked, each max_block_ms"
        assert failures("paging") - before == 5
        lines = [ln for ln in logs.lines if ln.startswith("deadletter_failed")]
        assert "KafkaTimeoutError" in lines[0] and "counted lost, not sent" in lines[0]
        assert "not sent: the dead-letter topic's last send timed out" in lines[1]   # the sampled line of the rest

        gate = kafka_clients.deadletter_gate(producer)   # the producer's own: its clock now the test's
        now = [gate.retry_at - 1.0]   # still within the minute: not sent
        gate.clock = lambda: now[0]
        dead_letter(producer, kafka, 5)
        assert producer.sends == 1 and failures("paging") - before == 6

        create_topics(kafka_bootstrap, deadletters)   # the topic is there now: tried again after the minute
        now[0] += 1.0
        dead_letter(producer, kafka, 6)
        real.flush(timeout=10)
        assert producer.sends == 2 and failures("paging") - before == 6
        [written] = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, deadletters)]
        assert written["offset"] == 6
    finally:
        real.close(timeout=5)


class StandIn:
    """kafka-python's producer as ``send_deadletter`` uses it: ``send`` raises ``error`` (when set)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def send(self, topic: str, **kwargs: Any) -> Any:
        if self.error is not None:
            raise self.error
        return None


def test_the_wait_is_the_producers_own() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="t.")
    timed_out = CountingProducer(StandIn(KafkaTimeoutError("Failed to update metadata after 5.0 secs.")),
                                 kafka.topic(Topic.DEADLETTER))
    other = CountingProducer(StandIn(), kafka.topic(Topic.DEADLETTER))
    before = failures("actuator")
    for offset in range(3):
        dead_letter(timed_out, kafka, offset, stage="actuator")
        dead_letter(other, kafka, offset, stage="actuator")
    assert (timed_out.sends, other.sends) == (1, 3)
    assert failures("actuator") - before == 3


class NoAttributes:
    __slots__ = ("sends",)

    def __init__(self) -> None:
        self.sends = 0

    def send(self, topic: str, **kwargs: Any) -> Any:
        self.sends += 1
        raise KafkaTimeoutError("Failed to update metadata after 5.0 secs.")


def test_a_producer_that_takes_no_attribute_is_never_gated_and_nothing_raises() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="t.")
    producer = NoAttributes()
    before = failures("edge-control")
    for offset in range(2):
        dead_letter(producer, kafka, offset, stage="edge-control")
    assert producer.sends == 2 and failures("edge-control") - before == 2
