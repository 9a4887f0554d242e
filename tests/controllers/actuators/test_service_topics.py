"""The weight actuator creates the topics it writes (its dead letters', its findings') when it connects, with
``kafka.partitions``, as the stream worker, paging and the collectors do.

Before, it created none: on a broker that does not auto-create, its first dead letter blocked ``max_block_ms`` and
was lost, and its TopicGate then dropped every dead letter of the next minute unsent; on one that does, the topic
came with the broker's partition count. Real Kafka of the stack (it auto-creates: the configured partition count
tells the actuator's creation from the broker's); each test its own topic prefix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.config import KafkaSettings
from opsloop.topics import Topic
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from tests.controllers.actuators.support import ListSink
from tests.helpers import captured_logs, topic_partitions, unique

pytestmark = pytest.mark.integration


def actuator(tmp_path: Path, kafka: KafkaSettings, edge: str) -> ActuatorService:
    cfg = ActuatorConfig(store_dir=tmp_path, reconcile_interval_s=None,
                         targets=[{"edge": edge, "listener": "l", "kind": "haproxy", "socket": str(tmp_path / "none"),
                                   "backend": "be", "servers": {"a": "a", "b": "b"}}])
    return ActuatorService(cfg, kafka, [edge], AuditLog([ListSink()]))


def test_connect_creates_the_dead_letter_and_findings_topics(tmp_path: Path, kafka_bootstrap: str) -> None:
    edge = unique("h7a")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=edge + ".", partitions=2)
    svc = actuator(tmp_path, kafka, edge)
    svc.connect()
    try:
        # no dead letter nor finding sent yet: the topics are there, with the configured partitions (the broker's
        # auto-creation would give its own 4)
        assert topic_partitions(kafka_bootstrap, kafka.topic(Topic.DEADLETTER)) == 2
        assert topic_partitions(kafka_bootstrap, kafka.topic(Topic.FINDINGS)) == 2
    finally:
        svc.close()


def test_a_creation_refused_is_said_and_the_actuator_goes_on(tmp_path: Path, kafka_bootstrap: str) -> None:
    edge = unique("h7a")
    # one broker cannot hold two replicas: refused, as an actuator without the right to create topics is
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=edge + ".", replication_factor=2)
    svc = actuator(tmp_path, kafka, edge)
    with captured_logs() as logs:
        svc.connect()
    try:
        [refused] = [ln for ln in logs.lines if ln.startswith("topics_not_created")]
        assert kafka.topic(Topic.DEADLETTER) in refused and "'service': 'actuator'" in refused
        assert "at the next start" in refused
        assert svc._producer is not None and svc._consumer is not None   # connected all the same
        svc.step()
    finally:
        svc.close()
