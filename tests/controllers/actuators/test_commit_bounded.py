"""An offset commit the broker does not answer is bounded and retried; the step goes on.

Records polled and handled but not committed when the broker went away: kafka-python's ``commit()`` waits for the
group coordinator up to ``request_timeout_ms`` (30 s) and raises ``KafkaTimeoutError``. Before, ``step()`` called it
without a bound and the error left the step (``step_failed``, a traceback): each step while the broker was away
took some 30 s, so the ticks -- drift put back (reconcile), fail static, the findings outbox -- ran once every
~31 s instead of every poll. Now it waits ``COMMIT_TIMEOUT_S`` (2 s), is counted
(``opsloop_actuator_commit_failures_total``) and stays owed for the next step.

The consumer is kafka-python's own, its broker a port nothing listens on (the broker gone)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from prometheus_client import REGISTRY

from tests.controllers.actuators.support import decision
from tests.controllers.actuators.test_applier import _service
from tests.helpers import unique


class RecordingConsumer(KafkaConsumer):
    """kafka-python's consumer, noting the bound each commit was given."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.commit_timeouts: list[int | None] = []

    def commit(self, offsets: Any = None, timeout_ms: int | None = None) -> None:
        self.commit_timeouts.append(timeout_ms)
        super().commit(offsets, timeout_ms=timeout_ms)


def _failures() -> float:
    return REGISTRY.get_sample_value("opsloop_actuator_commit_failures_total") or 0.0


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_commit_without_broker_is_bounded_counted_and_owed(tmp_path: Path) -> None:
    svc, target, _, sink, edge = _service(tmp_path)
    consumer = RecordingConsumer(bootstrap_servers=f"127.0.0.1:{_closed_port()}", group_id=unique("grp"),
                                 api_version=(2, 8, 0), enable_auto_commit=False, client_id="commit-bounded")
    try:
        tp = TopicPartition("edge.weights", 0)
        consumer.assign([tp])
        consumer.seek(tp, 3)                  # records up to offset 2 polled before the broker went away ...
        svc._consumer = consumer
        svc.handle_records([(f"l|{edge}".encode(), decision(1, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=edge,
                                                            listener="l").encode())])
        svc._uncommitted = True               # ... and handled (step() sets it when a poll returns records)
        failures = _failures()

        svc.step()                            # applies the decision, then tries the commit: no broker
        assert sink.results == ["applied"]
        [bound] = consumer.commit_timeouts
        assert bound is not None and bound <= 5000   # not request_timeout_ms (30 s): the ticks wait no longer
        assert _failures() == failures + 1
        assert svc._uncommitted               # still owed: the next step tries again

        svc.step()
        assert len(consumer.commit_timeouts) == 2 and svc._uncommitted
        assert _failures() == failures + 2
    finally:
        consumer.close()
