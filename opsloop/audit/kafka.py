"""Publish audit records to the Kafka ``audit`` topic (optional sink; keyed by target).

The topic is for other consumers (a SIEM, a second indexer); opsloop's own Elasticsearch indexer
does not depend on it. Sending is asynchronous and a failure is counted and logged, never raised:
an actuator must not fail because the audit topic is unreachable.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from opsloop.records import AuditRecord
from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options, kafka_settings
from opsloop.log import get_logger
from opsloop.topics import Topic

log = get_logger("audit.kafka")

PUBLISHED = Counter("opsloop_audit_published_total", "Audit records acknowledged by Kafka", ["topic"])
PUBLISH_FAILURES = Counter("opsloop_audit_publish_failures_total", "Audit records Kafka did not acknowledge",
                           ["topic"])


class KafkaAuditPublisher:
    def __init__(self, kafka: KafkaSettings | str, topic: str = Topic.AUDIT.value, client_id: str = "opsloop-audit",
                 producer: Any = None) -> None:
        k = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.topic = k.topic(topic)
        if producer is None:
            from kafka import KafkaProducer

            producer = KafkaProducer(**client_options(k), client_id=client_id, acks="all",
                                     linger_ms=5, request_timeout_ms=10_000, max_block_ms=5_000)
        self._producer = producer

    def submit(self, record: AuditRecord) -> None:
        try:
            fut = self._producer.send(self.topic, key=(record.edge or record.target).encode(), value=record.encode())
        except Exception as e:  # noqa: BLE001 - buffer full / metadata timeout: count, never raise
            self._failed(record, e)
            return
        fut.add_callback(lambda _md: PUBLISHED.labels(self.topic).inc())
        fut.add_errback(lambda e: self._failed(record, e))

    def _failed(self, record: AuditRecord, error: BaseException) -> None:
        PUBLISH_FAILURES.labels(self.topic).inc()
        log.warning("audit_publish_failed", topic=self.topic, id=record.id, error=f"{type(error).__name__}: {error}")

    def flush(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.close(timeout=timeout_s)
