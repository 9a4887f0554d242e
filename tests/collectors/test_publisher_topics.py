"""A collector started before the stream worker (which creates the telemetry topics) creates the topics of its rounds
itself, with ``kafka.partitions`` and ``kafka.replication_factor``, before its first send to them.

Before, the publisher sent to topics that did not exist: kafka-python logged "Topic ... not found in cluster
metadata" and the broker auto-created them with its own partition count (the test broker's: 4), not the configured
one, so the stream stage's parallelism and key placement were not the configured ones (and on a broker that does not
auto-create, every send blocked ``max_block_ms``). A topic it may not create is said (``topics_not_created``) and
the records still go out to what the broker offers.

Real Kafka of the ``stack`` fixture; each test its own topic prefix.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from opsloop.collect.publisher import Publisher
from opsloop.collect.spool import Record
from opsloop.config import KafkaSettings
from opsloop.topics import Topic
from tests.helpers import KeptLines, captured_logs, read_topic, topic_partitions, unique

pytestmark = pytest.mark.integration


def records(n: int) -> list[Record]:
    return [Record(Topic.LB.value, f"edge-{i}", b'{"name":"x"}') for i in range(n)]


def test_the_first_publish_creates_the_topic_with_the_configured_partitions(tmp_path: Path,
                                                                            kafka_bootstrap: str) -> None:
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("fresh") + ".", partitions=2)
    topic = kafka.topic(Topic.LB)
    client_lines = KeptLines()
    client_log = logging.getLogger("kafka")
    client_log.addHandler(client_lines)
    pub = Publisher(kafka, tmp_path / "spool", collector=unique("lb"), send_timeout_s=10.0)
    try:
        pub.publish(records(6))
        assert pub.flush(30.0), "the round was not acknowledged"
    finally:
        pub.close(5.0)
        client_log.removeHandler(client_lines)
    assert [ln for ln in client_lines.lines if "not found in cluster metadata" in ln] == []
    assert topic_partitions(kafka_bootstrap, topic) == 2   # the broker's default would be 4
    assert len(read_topic(kafka_bootstrap, topic)) == 6


def test_a_topic_it_may_not_create_is_said_and_the_records_still_go_out(tmp_path: Path, kafka_bootstrap: str) -> None:
    # one broker cannot hold two replicas: the creation is refused, as it is to a collector without the ACL
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("refused") + ".", partitions=2,
                          replication_factor=2)
    topic = kafka.topic(Topic.LB)
    pub = Publisher(kafka, tmp_path / "spool", collector=unique("lb"), send_timeout_s=10.0)
    try:
        with captured_logs() as logs:
            pub.publish(records(3))
            assert pub.flush(30.0), "the round was not acknowledged"
            pub.publish(records(2))   # the same producer: not checked again
            assert pub.flush(30.0), "the second round was not acknowledged"
    finally:
        pub.close(5.0)
    [refused] = [ln for ln in logs.lines if ln.startswith("topics_not_created")]
    assert topic in refused and "InvalidReplicationFactor" in refused
    assert len(read_topic(kafka_bootstrap, topic)) == 5   # auto-created by the broker: what the cluster offers
