"""Kafka side of the service: publishing decisions and findings, recovering the last decision.

A decision whose weights records were not all acknowledged raises :class:`PublishError` (naming the
keys that were), so the loop keeps what was published, not what it meant to publish.

Restart recovery reads ``edge.weights`` from the beginning and keeps the highest ``(epoch, version)``
per ``listener|edge`` key, so a restarted controller continues the version sequence (actuators refuse
older versions) and damps from the weights in force, not from scratch. A record that does not decode is
skipped, logged with its offset and why (a version or epoch beyond the record's ranges is refused at decode,
:mod:`opsloop.records.edge`), and so is one the service could not continue from: an epoch of exactly
:data:`LAST_EPOCH` (this instance takes one more than the highest recovered) or a version above
:data:`MAX_RECOVERED_VERSION`. Such a record recovered (2**64 - 1, then valid to the schema), every record
the service made after it carried 2**64 and failed to encode: every publish failed, for good.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from opsloop.records import EdgeWeights
from opsloop.records.edge import LAST_EPOCH
from opsloop.controllers.edge.service import metrics as M
from opsloop.config import KafkaSettings
from opsloop.records import Finding
from opsloop.kafka_clients import client_options, kafka_settings, send_deadletter, service_producer
from opsloop.log import get_logger
from opsloop.topics import Topic

log = get_logger("controller.edge.kafka")
# The largest version recovered: one a second for 285 million years, and far enough below the 2**63 - 1 the
# actuators keep for the sequence to go on from it (every JSON reader holds it exactly, a double's 2**53).
MAX_RECOVERED_VERSION = 2 ** 53


class PublishError(RuntimeError):
    """Records of a decision were not acknowledged; ``delivered``: the ``listener|edge`` keys that were
    (the others may still arrive later: at-least-once)."""

    def __init__(self, message: str, delivered: set[str] | None = None) -> None:
        super().__init__(message)
        self.delivered = set(delivered or ())


class DecisionPublisher:
    def __init__(self, kafka: KafkaSettings | str, client_id: str = "opsloop-edge-controller",
                 flush_timeout_s: float = 5.0) -> None:
        self.kafka = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.producer = service_producer(self.kafka, client_id, linger_ms=0, request_timeout_ms=10_000,
                                         max_block_ms=5_000)
        self.flush_timeout_s = flush_timeout_s

    def __call__(self, records: list[EdgeWeights], findings: list[Finding]) -> None:
        """Send and flush; :class:`PublishError` when a weights record was not acknowledged, so the
        loop does not take an unpublished decision for the weights in force (a finding lost is only
        counted: the next tick re-publishes the open ones)."""
        sent = [(f"{r.listener}|{r.edge}", self._send(self.kafka.topic(Topic.EDGE_WEIGHTS),
                                                      f"{r.listener}|{r.edge}", r.encode())) for r in records]
        for f in findings:
            self._send(self.kafka.topic(Topic.FINDINGS), f.id, f.encode())
        flush_error = ""
        try:
            self.producer.flush(timeout=self.flush_timeout_s)
        except Exception as e:  # noqa: BLE001 - reported below, per record
            flush_error = f"; flush: {type(e).__name__}: {e}"
            log.warning("publish_flush_failed", error=f"{type(e).__name__}: {e}")
        delivered = {key for key, fut in sent if fut is not None and fut.succeeded()}
        missing = [key for key, _ in sent if key not in delivered]
        if missing:
            raise PublishError(f"{len(missing)} of {len(sent)} edge.weights record(s) not acknowledged "
                               f"({', '.join(missing[:5])}){flush_error}"[:500], delivered)

    def _send(self, topic: str, key: str, value: bytes) -> Any:
        """The record's future, None when the producer refused it (counted and logged)."""
        try:
            fut = self.producer.send(topic, key=key.encode(), value=value)
        except Exception as e:  # noqa: BLE001 - buffer full / metadata timeout: count, never raise
            M.PUBLISH_ERRORS.labels(topic).inc()
            log.warning("publish_failed", topic=topic, key=key, error=f"{type(e).__name__}: {e}")
            return None
        fut.add_errback(lambda e: (M.PUBLISH_ERRORS.labels(topic).inc(),
                                   log.warning("publish_failed", topic=topic, key=key, error=str(e))))
        return fut

    def deadletter(self, record: Any, reason: str) -> None:
        """Keep a consumed record that was refused (``record``: a Kafka consumer record) on the
        dead-letter topic, in the stream stage's shape. Never raises (a broker hiccup is logged)."""
        send_deadletter(self.producer, self.kafka, reason, source_topic=record.topic,
                        partition=record.partition, offset=record.offset, key=record.key,
                        value=record.value, stage="edge-control", log=log,
                        headers=getattr(record, "headers", None), value_is="record")

    def close(self) -> None:
        self.producer.close(timeout=5)


def recover_decisions(kafka: KafkaSettings | str, topic: str = Topic.EDGE_WEIGHTS.value,
                      timeout_s: float = 15.0) -> dict[tuple[str, str], EdgeWeights]:
    """The record with the highest ``(epoch, version)`` per (listener, edge) currently in ``topic``
    (a base name: ``kafka.topic_prefix`` is applied)."""
    k = kafka_settings(kafka)
    topic = k.topic(topic)
    consumer = KafkaConsumer(**client_options(k), group_id=None, enable_auto_commit=False,
                             client_id="opsloop-edge-recover")
    out: dict[tuple[str, str], EdgeWeights] = {}
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return out
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.position(tp) < end[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    try:
                        rec = EdgeWeights.decode(r.value)
                        unusable = not_recoverable(rec)
                    except ValueError as e:
                        unusable = str(e)
                    if unusable:
                        log.warning("recover_record_rejected", topic=topic, partition=r.partition, offset=r.offset,
                                    error=unusable[:300])
                        continue
                    key = (rec.listener, rec.edge)
                    if key not in out or rec.stamp >= out[key].stamp:
                        out[key] = rec
        return out
    finally:
        consumer.close()


def not_recoverable(rec: EdgeWeights) -> str:
    """Why the service cannot continue from ``rec`` (its stamp: module docstring), or "" when it can."""
    if rec.epoch >= LAST_EPOCH:   # a later one is refused at decode; this one leaves no epoch for this instance
        return (f"edge weights record {rec.listener}|{rec.edge}: epoch {rec.epoch} leaves no later epoch for this "
                f"instance (the last is {LAST_EPOCH}: 9999-12-31 in ms)")
    if rec.version > MAX_RECOVERED_VERSION:
        return (f"edge weights record {rec.listener}|{rec.edge}: version {rec.version} is above "
                f"{MAX_RECOVERED_VERSION}: no controller counted that far")
    return ""
