"""Audit trail: one record per paging action, on the ``audit`` topic and as a log line.

Records are :class:`opsloop.audit.AuditRecord` (the one audit shape of every actuator, also indexed
into Elasticsearch), keyed by finding id on the topic::

    {"schema_version": 1, "time": 1795310400.1, "actor": "opsloop-paging", "action": "page_opened",
     "target": "alert:FirewallUnprotectedPort", "mode": "live", "result": "sent",
     "reason": "...", "labels": {"finding_id": "...", "alertname": "...", "severity": "critical", ...}, "id": "..."}

Actions: page_opened, page_delivered, page_resolved, page_severity_changed, and page_rejected (Alertmanager
refused an alert: result ``sent`` when its ``OpsloopPageRejected`` fallback went in its place, ``failed``
when that was refused too and the page is lost; the reason says why).

The audit topic must never stop paging: a failed write is logged and counted, not retried. That holds for a
write the broker refuses after ``send`` returned (no ACL to write, a record over the topic's
``max.message.bytes``, a partition without a leader past the delivery timeout): kafka-python fails the send's
future on its I/O thread, and before, that loss was neither counted nor logged. Nor may it hold the loop up: a
topic the producer gets no metadata for (not created, on brokers that do not auto-create) made every ``send`` block
the producer's ``max_block_ms`` (5 s) first, one record after another in the paging step, delaying the pages behind
them. After one such timeout the records of the next :data:`UNAVAILABLE_RETRY_S` are counted lost at once, not sent.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from kafka.errors import KafkaTimeoutError

from opsloop.records import AuditRecord
from opsloop.kafka_clients import TopicGate
from opsloop.log import Sampled, get_logger

from opsloop.controllers.paging import metrics

log = get_logger("paging.audit")
ACTOR = "opsloop-paging"
FAIL_LOG = Sampled(60.0)      # a topic refusing writes fails every record: one line a minute (each counted)
# a send that timed out (no metadata for the topic within max_block_ms): not tried again for this long (monotonic)
UNAVAILABLE_RETRY_S = 60.0


class _Producer(Protocol):
    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> Any: ...
    def flush(self, timeout: float | None = None) -> None: ...


RESULTS = {"page_opened": "sent", "page_delivered": "sent", "page_resolved": "resolved",
           "page_severity_changed": "sent",
           "page_rejected": "failed"}   # "sent" when its OpsloopPageRejected fallback was sent in its place


MAX_AUDIT_LABELS = 31    # AuditRecord holds 32 labels; one is the finding id
MAX_TARGET = 300


def audit_record(action: str, finding_id: str, labels: dict[str, str], detail: str = "",
                 now: float | None = None, result: str | None = None) -> AuditRecord:
    """The audit record of one paging action; labels and target cut to the record's bounds, saying so."""
    kept = dict(list(labels.items())[:MAX_AUDIT_LABELS])
    if len(kept) < len(labels):
        detail = f"{detail} [audit labels cut: {len(labels) - len(kept)} of {len(labels)} left out]".strip()
    target = f"alert:{labels.get('alertname') or finding_id}"[:MAX_TARGET]
    return AuditRecord.build(time=time.time() if now is None else now, actor=ACTOR, action=action, target=target,
                 mode="live", result=result or RESULTS.get(action, "sent"), reason=detail[:4000],
                 labels={**{str(k)[:200]: str(v)[:1000] for k, v in kept.items()}, "finding_id": finding_id})


class Auditor:
    def __init__(self, producer: _Producer | None, topic: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.producer = producer
        self.topic = topic
        self._gate = TopicGate(clock, UNAVAILABLE_RETRY_S)   # the topic held back after a send timed out

    @property
    def clock(self) -> Callable[[], float]:
        """The gate's clock (monotonic; a test's own)."""
        return self._gate.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._gate.clock = clock

    def record(self, action: str, finding_id: str, labels: dict[str, str], detail: str = "",
               result: str | None = None) -> None:
        log.info("audit", action=action, finding_id=finding_id, alertname=labels.get("alertname", ""),
                 severity=labels.get("severity", ""), detail=detail)
        try:
            rec = audit_record(action, finding_id, labels, detail, result=result)
        except Exception as e:  # noqa: BLE001 - a record we cannot build must not stop paging
            metrics.AUDIT_FAILURES.inc()
            log.error("audit_record_invalid", error=str(e)[:500], action=action, finding_id=finding_id)
            return
        if self.producer is None:
            return
        if (left := self._gate.held()) is not None:   # not sent: it would block max_block_ms again, and be lost
            metrics.AUDIT_FAILURES.inc()
            FAIL_LOG.error(log, "audit_write_failed", key="unavailable", topic=self.topic, action=action,
                           finding_id=finding_id, error="topic unavailable: its last send timed out",
                           retry_in_s=round(left, 1))
            return
        try:
            future = self.producer.send(self.topic, key=finding_id.encode(), value=rec.encode())
        except KafkaTimeoutError as e:   # no metadata for the topic (not created?) or no buffer within max_block_ms
            metrics.AUDIT_FAILURES.inc()
            self._gate.trip()
            log.error("audit_write_failed", error=str(e)[:500], topic=self.topic, action=action, finding_id=finding_id,
                      consequence=f"audit records of the next {UNAVAILABLE_RETRY_S:g}s counted lost, not sent")
            return
        except Exception as e:  # noqa: BLE001 - the audit path must not break paging
            metrics.AUDIT_FAILURES.inc()
            log.error("audit_write_failed", error=str(e), action=action, finding_id=finding_id)
            return
        add_errback = getattr(future, "add_errback", None)   # kafka-python's future; a test double returns none
        if add_errback is not None:
            add_errback(_not_written, self.topic, action, finding_id)

    def flush(self, timeout_s: float = 2.0) -> None:
        if self.producer is None:
            return
        try:
            self.producer.flush(timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - not counted: a record still in flight is counted if it fails
            log.warning("audit_flush_failed", error=str(e)[:500])   # (_not_written); counted here, it was twice


def _not_written(topic: str, action: str, finding_id: str, error: BaseException) -> None:
    """A record the broker refused or never acknowledged (runs on the producer's I/O thread): counted, logged."""
    metrics.AUDIT_FAILURES.inc()
    FAIL_LOG.error(log, "audit_write_failed", key="refused", error=str(error)[:500], topic=topic, action=action,
                   finding_id=finding_id)
