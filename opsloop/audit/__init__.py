"""The audit trail: every actuator action and every page, to Kafka and into Elasticsearch.

* the record itself (actor, action, target, version, before, after, reason, mode, result, time) and its
  Elasticsearch document: :class:`opsloop.records.AuditRecord`, beside every other topic's record;
* :mod:`opsloop.audit.trail`: :class:`AuditLog`, the one call actuators make;
* :mod:`opsloop.audit.settings`: :class:`AuditSettings`, the ``audit`` section of the config file;
* :mod:`opsloop.audit.indexer`: buffered, bounded, retried bulk indexing into Elasticsearch;
* :mod:`opsloop.audit.kafka`: the optional ``audit`` topic publisher;
* :mod:`opsloop.audit.search`: "why did the weights of edge X change at 03:12?";
* :mod:`opsloop.audit.templates`: the index templates (audit trail, Filebeat-shipped logs).

The package imports none of them: validating a config reads the settings without loading the
Elasticsearch and Kafka clients the trail needs.
"""
