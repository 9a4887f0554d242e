"""``AuditLog``: the one call every actuator makes for every action (and every page).

    audit = AuditLog.from_settings(settings)          # controllers.audit section of opsloop.yaml
    audit.record(actor="controller.edge", action="edge.weights.push", target="haproxy:ams1/app",
                 edge="ams1", listener="app", version=42, before=old, after=new,
                 reason="origin eu over capacity (1.12)", mode="live", result="applied")
    ...
    audit.close()                                     # flushes what is still buffered

Each record goes to the structured log (event ``audit``), to Elasticsearch through the buffered
:class:`~opsloop.audit.indexer.ElasticsearchIndexer`, and to the Kafka ``audit`` topic when enabled.
``record`` never raises because a sink is down; it raises :class:`~opsloop.records.AuditError` only for
a record that is itself invalid (a programming error in the actuator, better caught in its tests).

Its configuration (the ``audit`` section): :mod:`opsloop.audit.settings`.
"""

from __future__ import annotations

from typing import Any, Protocol

from opsloop.audit.indexer import ElasticsearchIndexer, client_for
from opsloop.audit.kafka import KafkaAuditPublisher
from opsloop.audit.settings import AuditSettings
from opsloop.records import AuditRecord
from opsloop.config import Settings
from opsloop.log import get_logger

log = get_logger("audit")


class AuditSink(Protocol):
    def submit(self, record: AuditRecord) -> None: ...


class AuditLog:
    def __init__(self, sinks: list[AuditSink] | None = None) -> None:
        self.sinks: list[AuditSink] = list(sinks or [])

    @classmethod
    def from_settings(cls, settings: Settings, start: bool = True) -> "AuditLog":
        cfg = AuditSettings.from_settings(settings)
        sinks: list[AuditSink] = []
        es = cfg.es()
        if es is not None:
            indexer = ElasticsearchIndexer(client_for(es), cfg.stream, cfg.max_buffered,
                                           cfg.batch_size, max_backoff_s=cfg.max_backoff_s)
            sinks.append(indexer.start() if start else indexer)
        if cfg.kafka:
            sinks.append(KafkaAuditPublisher(settings.kafka, client_id=f"{settings.kafka.client_id}-audit"))
        return cls(sinks)

    def record(self, **fields: Any) -> AuditRecord:
        """Build, log and hand one record to every sink; returns it (its ``id`` links a page to it)."""
        rec = AuditRecord.build(**fields)
        self.write(rec)
        return rec

    def write(self, rec: AuditRecord) -> None:
        log.info("audit", id=rec.id, actor=rec.actor, action=rec.action, target=rec.target, edge=rec.edge,
                 version=rec.version, mode=rec.mode.value, result=rec.result, reason=rec.reason)
        for sink in self.sinks:
            try:
                sink.submit(rec)
            except Exception as e:  # noqa: BLE001 - a sink's bug must not fail the actuator
                log.error("audit_sink_failed", sink=type(sink).__name__, id=rec.id, error=f"{type(e).__name__}: {e}")

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()
