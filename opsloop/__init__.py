"""opsloop: event-driven telemetry and closed-loop control for cloud and edge operators.

The shared core every stage uses: the wire format (:mod:`opsloop.wire`), findings
(:mod:`opsloop.records`), configuration, JSON logging, metrics, the collector runtime
(:mod:`opsloop.collect`) and the local stack manager (:mod:`opsloop.stack`).
"""

__version__ = "0.1.0"
