"""Every topic's record schema, in one place (the topic names and routing: :mod:`opsloop.topics`).

=======================  ====================================  ===========================================
topic                    record                                written by → read by
=======================  ====================================  ===========================================
``telemetry.*``          :class:`Metric` (batches:             collectors, Telegraf → stream workers
                         :mod:`opsloop.wire`)
``telemetry.deadletter`` :func:`deadletter_record`             every consumer → operators
``findings``             :class:`Finding`                      detectors → paging actuator
``edge.demand``          :class:`EdgeDemand`                   stream workers → edge control
``edge.weights``         :class:`EdgeWeights`                  edge control → weight actuators
``audit``                :class:`AuditRecord`                  actuators → Elasticsearch
=======================  ====================================  ===========================================

The derived topics' records share :class:`JsonRecord`: JSON via orjson, ``schema_version`` checked,
and decoding that raises :class:`RecordError` naming the record, the field and the value.
"""

from opsloop.records.audit import AuditError, AuditMode, AuditRecord
from opsloop.records.base import JsonRecord, RecordError
from opsloop.records.deadletter import DEADLETTER_VALUE_LIMIT, deadletter_record
from opsloop.records.edge import EdgeDemand, EdgeWeights, Mode, OriginState
from opsloop.records.finding import Finding, Severity
from opsloop.records.metric import FieldValue, Metric, metric

__all__ = ["AuditError", "AuditMode", "AuditRecord", "DEADLETTER_VALUE_LIMIT", "EdgeDemand", "EdgeWeights",
           "FieldValue", "Finding", "JsonRecord", "Metric", "Mode", "OriginState", "RecordError", "Severity",
           "deadletter_record", "metric"]
