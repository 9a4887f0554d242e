"""``AuditLog``: the one call every actuator makes for every action (and every page).

    audit = AuditLog.from_settings(settings)          # controllers.audit section of opsloop.yaml
    audit.record(actor="controller.edge", action="edge.weights.push", target="haproxy:ams1/app",
                 edge="ams1", listener="app", version=42, before=old, after=new,
                 reason="origin eu over capacity (1.12)", mode="live", result="applied")
    ...
    audit.close()                                     # flushes what is still buffered

Each record goes to the structured log (event ``audit``), to Elasticsearch through the buffered
:class:`~opsloop.audit.indexer.ElasticsearchIndexer`, and to the Kafka ``audit`` topic when enabled.
``record`` never raises because a sink is down; it raises :class:`AuditError` only for a record that
is itself invalid (a programming error in the actuator, better caught in its tests).

Configuration (all keys optional)::

    audit:
        elasticsearch:                              # omit: no indexing (log and Kafka only)
          hosts: ["https://es1:9200"]               # auth and CA: opsloop/es_client.py
          api_key_file: /etc/opsloop/secrets/es-api-key
          ca_file: /etc/opsloop/es-ca.pem
        elasticsearch_url: http://127.0.0.1:29200   # the short form: one host, no auth
        stream: opsloop-audit                       # data stream name (must start with opsloop-audit)
        max_buffered: 10000                         # records kept while Elasticsearch is down
        kafka: true                                 # also publish to the `audit` topic
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opsloop.audit.indexer import DEFAULT_STREAM, ElasticsearchIndexer, client_for
from opsloop.audit.kafka import KafkaAuditPublisher
from opsloop.records import AuditError, AuditRecord
from opsloop.config import Settings
from opsloop.es_client import ElasticsearchSettings, check_url
from opsloop.log import get_logger
from opsloop.validation import describe_validation_error

log = get_logger("audit")
SECTION = "audit"


class AuditSink(Protocol):
    def submit(self, record: AuditRecord) -> None: ...


class AuditSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    elasticsearch_url: str | None = Field(default=None, pattern=r"^https?://")
    elasticsearch: ElasticsearchSettings = Field(default_factory=ElasticsearchSettings)
    stream: str = Field(default=DEFAULT_STREAM, pattern=r"^opsloop-audit[a-z0-9._\-]*$")
    max_buffered: int = Field(default=10_000, ge=1, le=10_000_000)
    batch_size: int = Field(default=500, ge=1, le=10_000)
    max_backoff_s: float = Field(default=30.0, gt=0)
    kafka: bool = False

    @field_validator("elasticsearch_url")
    @classmethod
    def _no_credentials(cls, url: str | None) -> str | None:
        return url if url is None else check_url(url, "elasticsearch_url")

    @model_validator(mode="after")
    def _one_host_list(self) -> "AuditSettings":
        if self.elasticsearch_url and self.elasticsearch.hosts:
            raise ValueError("set elasticsearch_url or elasticsearch.hosts, not both")
        return self

    def es(self) -> ElasticsearchSettings | None:
        """The Elasticsearch connection (``elasticsearch_url`` is the one-host form), None when not set."""
        if self.elasticsearch_url:
            return self.elasticsearch.with_hosts([self.elasticsearch_url])
        return self.elasticsearch if self.elasticsearch.hosts else None

    @classmethod
    def from_settings(cls, settings: Settings) -> "AuditSettings":
        try:
            return cls.model_validate(settings.section(SECTION))
        except ValidationError as e:
            raise AuditError(f"{SECTION}: {describe_validation_error(e)}") from None


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
