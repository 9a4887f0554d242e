"""The paging loop's offset commit is bounded when the broker is away; the step goes on delivering.

kafka-python's ``commit()`` waits for the group coordinator up to ``request_timeout_ms`` (30 s) and raises
``KafkaTimeoutError``. Before, ``step()`` called it without a bound: each step while the broker was away took
~30 s plus the 1 s pause after ``step_failed`` (a traceback each time), so re-sends, resolves and the pages of
findings already read waited that long. Now it waits ``COMMIT_TIMEOUT_S`` (2 s), is counted
(``opsloop_paging_commit_failures_total``) and stays owed for the next step.

The consumer is kafka-python's own, its broker a port nothing listens on (the broker gone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka import TopicPartition
from prometheus_client import REGISTRY

from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.controllers.actuators.test_commit_bounded import RecordingConsumer as CommitRecordingConsumer
from tests.controllers.actuators.test_commit_bounded import _closed_port
from tests.helpers import unique


class RecordingConsumer(CommitRecordingConsumer):
    """kafka-python's consumer noting each commit's bound (the actuator's test's); polls return nothing."""

    def poll(self, timeout_ms: int = 0, **kw: Any) -> dict:
        return {}


def _failures() -> float:
    return REGISTRY.get_sample_value("opsloop_paging_commit_failures_total") or 0.0


def test_a_commit_without_broker_is_bounded_counted_and_owed(tmp_path: Path) -> None:
    consumer = RecordingConsumer(bootstrap_servers=f"127.0.0.1:{_closed_port()}", group_id=unique("grp"),
                                 api_version=(2, 8, 0), enable_auto_commit=False, client_id="paging-commit-bounded")
    try:
        tp = TopicPartition("findings", 0)
        consumer.assign([tp])
        consumer.seek(tp, 3)      # findings up to offset 2 read and handled before the broker went away
        cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest")
        svc = PagingService(cfg, "127.0.0.1:1", consumer=consumer, producer=None)  # type: ignore[arg-type]
        svc._caught_up = True
        svc._uncommitted = True   # step() sets it when the state holding them could not be committed yet
        failures = _failures()

        svc.step()
        [bound] = consumer.commit_timeouts
        assert bound is not None and bound <= 5000   # not request_timeout_ms (30 s): delivery waits no longer
        assert _failures() == failures + 1
        assert svc._uncommitted                      # still owed: the next step tries again

        svc.step()
        assert len(consumer.commit_timeouts) == 2 and svc._uncommitted
        assert _failures() == failures + 2
    finally:
        consumer.close()
