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

Types are strict on the wire: a number is a JSON number (an int where a float goes, ``12.0`` where an int goes),
never a bool or a string of digits; a flag is ``true``/``false``. Bounds at decode (each refused naming the field):

=============================  ==============================================================================
record                         bound
=============================  ==============================================================================
:class:`Finding`               ``first_seen``/``last_seen`` 1970..9999 in s; ``where`` at most 66 labels (a
                               sample's 64 tags + metric, field), names <= 256 chars, values <= 1024 chars
:class:`EdgeDemand`            edge, backend, origin names <= 256 chars; rates <= 1e12 req/s, rtime <= 1e9 ms,
                               status <= 64 chars
:class:`EdgeWeights`           listener, edge, origin names <= 256 chars; version <= 2**63 - 1, epoch <= 9999
                               in ms; shares in [0, 1] summing to 1
:class:`AuditRecord`           tokens, target, reason, error, <= 32 labels, before/after <= 32 KiB
:class:`Metric`                name <= 200 chars, <= 64 tags, 1..256 fields, timestamp 2000..2100 in s
=============================  ==============================================================================

Left unbounded, and why: free text (``what``, ``explanation``, ``reason``; the anomaly detector's explanation
quotes a series' whole tag set; paging cuts annotations to 2048), the number of a backend's origins (HAProxy
has no small limit), the length of a sample's tags (the stream stage shortens one where it becomes a state key
or a label, counted: refusing it would lose the sample). Kafka's 1 MB bounds each record.
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
