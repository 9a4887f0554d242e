"""``AuditSettings``: the ``audit`` section of opsloop.yaml, apart from the sinks it configures.

Validating a config file (``opsloop config check``, every service at start) reads this model only:
the Elasticsearch and Kafka clients load with :mod:`opsloop.audit.trail`, when a trail is built.

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

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from opsloop.audit.templates import DEFAULT_STREAM
from opsloop.config import Settings
from opsloop.es_client import ElasticsearchSettings, check_url
from opsloop.records import AuditError
from opsloop.validation import NoBoolNumbers, describe_validation_error

SECTION = "audit"


class AuditSettings(NoBoolNumbers):   # `max_buffered: yes` (YAML's boolean) was a buffer of 1 record
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
