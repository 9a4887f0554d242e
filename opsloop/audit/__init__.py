"""The audit trail: every actuator action and every page, to Kafka and into Elasticsearch.

* :mod:`opsloop.audit.record`: :class:`AuditRecord` (actor, action, target, version, before, after,
  reason, mode, result, time) and its Elasticsearch document;
* :mod:`opsloop.audit.trail`: :class:`AuditLog`, the one call actuators make;
* :mod:`opsloop.audit.indexer`: buffered, bounded, retried bulk indexing into Elasticsearch;
* :mod:`opsloop.audit.kafka`: the optional ``audit`` topic publisher;
* :mod:`opsloop.audit.search`: "why did the weights of edge X change at 03:12?";
* :mod:`opsloop.audit.templates`: the index templates (audit trail, Filebeat-shipped logs).
"""

from opsloop.audit.record import AuditError, AuditMode, AuditRecord, build
from opsloop.audit.trail import AuditLog, AuditSettings

__all__ = ["AuditError", "AuditLog", "AuditMode", "AuditRecord", "AuditSettings", "build"]
