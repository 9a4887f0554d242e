"""The dead-letter metric every stage shares: in the core, not in a stage, so the stream worker and every controller
count under one name; in a module of its own because ``opsloop.kafka_clients`` imports kafka-python, which loading
the stream stage's settings (``opsloop config check``) must not (tests/core/test_imports.py)."""

from __future__ import annotations

from prometheus_client import Counter

# A dead letter not written is a refused record gone for good: alerted (OpsloopDeadLettersNotWritten).
DEADLETTER_SEND_FAILURES = Counter("opsloop_deadletter_send_failures_total",
                                   "Dead letters never written to the dead-letter topic (the send raised, or the "
                                   "broker refused or timed out the delivery): the refused record is lost", ["stage"])
