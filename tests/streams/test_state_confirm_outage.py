"""A batch whose state writes the broker does not acknowledge for longer than STATE_CONFIRM_S because the broker is
away, on the real path: a real worker (``tests/streams/confirm_worker.py``: the worker with STATE_CONFIRM_S at 2 s and a
gate that holds a batch before it is handled), its ``detector-state`` changelog on the test stack's broker, the broker
stopped by PID with the batch's record fetched, the batch then let go to write its state into the outage.

Before (old code): after STATE_CONFIRM_S the writes aiokafka still held were counted as failed: ``state_write_failed``,
a dead letter naming the key, ``opsloop_stream_errors_total``, for a loss that did not happen (aiokafka delivered them
once the broker was back); and the batch was acked, its offsets committable before its state was written.
Now: the batch waits as long as the producer holds its writes (``state_writes_waiting`` logged once,
``opsloop_stream_state_writes_waiting`` > 0 meanwhile), its offsets uncommitted; it goes on when they land; a stop
during the wait ends it at once and leaves the batch uncommitted: read again after the restart."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from opsloop.stack.process import ManagedProcess
from tests.helpers import REPO, metrics_up, scrape_metric, unique, wait_until
from tests.streams.detectors.test_keystone_state_bounds_live import Run, _cred
from tests.streams.test_state_write_refused import _deadletters

pytestmark = pytest.mark.integration

CONFIRM_S = 2.0
WAITING = "opsloop_stream_state_writes_waiting"


class ConfirmRun(Run):
    """:class:`Run` whose worker says it waits after CONFIRM_S and holds its batches while the gate file exists."""

    def __init__(self, stack: Any, tmp: Path) -> None:
        super().__init__(stack, tmp)
        self.gate = tmp / "gate"
        self.starts = 0

    def start(self) -> ManagedProcess:
        self.starts += 1
        port = self.port
        w = ManagedProcess(name=f"confirm-worker-{self.starts}",
                           argv=[sys.executable, "-m", "tests.streams.confirm_worker", "--confirm-s", str(CONFIRM_S),
                                 "--gate", str(self.gate), "--config", str(self.config)],
                           workdir=self.tmp / "worker", env={"PYTHONPATH": str(REPO)},
                           ready=lambda: metrics_up(port), ready_timeout_s=90)
        w.start()
        return w

    def warm_up(self) -> None:
        """One batch through, state written and committed: the worker's clients know every topic."""
        probe = unique("rgw-warm")
        self.send([(probe, [_cred(probe, "AKIAWARM", time.time() - 60, 1)])])
        wait_until(lambda: self.state(probe)[0], timeout=90, what="the first batch's state written")
        wait_until(self.committed, timeout=60, what="the first batch committed")

    def batch_into_outage(self, kafka: ManagedProcess, host: str, validations: float) -> None:
        """A batch of ``host`` fetched and held, the broker stopped, the batch let go."""
        held = self.gate.with_name(self.gate.name + ".held")
        self.gate.touch()
        self.send([(host, [_cred(host, "AKIAOUT", time.time() - 120, validations)])])
        wait_until(held.exists, timeout=60, what="the batch fetched and held")
        kafka.stop()
        self.gate.unlink()
        wait_until(lambda: self.window(host) == validations, timeout=60, what="the batch handled in the outage")

    def waiting(self) -> float:
        return scrape_metric(self.port, WAITING, {"agent": "detectors"}) or 0.0


def _events(worker: ManagedProcess, event: str) -> list[dict[str, Any]]:
    return [orjson.loads(x)["fields"] for x in worker.logfile.read_text().splitlines() if f'"event":"{event}"' in x]


def _waiting_or_failed(run: ConfirmRun, worker: ManagedProcess) -> bool:
    """The batch says it waits, or (old code) gave its writes up."""
    return run.waiting() > 0 or bool(_events(worker, "state_write_failed"))


def test_a_batch_waits_through_a_broker_outage_for_its_state_writes_and_goes_on_when_they_land(
        stack: Any, tmp_path: Path) -> None:
    run = ConfirmRun(stack, tmp_path)
    host = unique("rgw-outage")
    kafka = stack.component("kafka")
    worker = run.start()
    try:
        run.warm_up()
        run.batch_into_outage(kafka, host, 3)
        wait_until(lambda: _waiting_or_failed(run, worker), timeout=60, what="the batch waiting for its writes")
        assert _events(worker, "state_write_failed") == [], "a write aiokafka still holds was counted as failed"
        assert run.waiting() == 1   # one key's write
        waiting = wait_until(lambda: _events(worker, "state_writes_waiting"), timeout=30, what="the wait logged")
        assert waiting[0]["keys"] == 1 and waiting[0]["agent"] == "detectors", waiting

        stack.start_component("kafka")   # the broker back: the writes land, the batch goes on
        wait_until(lambda: run.state(host)[0], timeout=120, what="the host's state written")
        wait_until(run.committed, timeout=120, what="the batch's offsets committed")
        wait_until(lambda: run.waiting() == 0, timeout=30, what="the wait over")
        assert _deadletters(run, host) == []
        assert _events(worker, "state_write_failed") == []
        assert len(_events(worker, "state_writes_waiting")) == 1   # once per wait, not per look
        assert _events(worker, "state_writes_confirmed"), worker.tail(20)
        assert worker.running(), worker.tail(40)
        worker = run.restart_and_restore(worker)
        assert run.window(host) == 3
    finally:
        if not kafka.running():
            stack.start_component("kafka")
        worker.stop()


def test_a_worker_stopped_while_its_batch_waits_for_the_broker_stops_and_reads_the_batch_again(
        stack: Any, tmp_path: Path) -> None:
    run = ConfirmRun(stack, tmp_path)
    host = unique("rgw-stopped")
    kafka = stack.component("kafka")
    worker = run.start()
    try:
        run.warm_up()
        run.batch_into_outage(kafka, host, 4)
        wait_until(lambda: _waiting_or_failed(run, worker), timeout=60, what="the batch waiting for its writes")
        assert _events(worker, "state_write_failed") == [], "a write aiokafka still holds was counted as failed"
        # SIGTERM during the wait: the agent lets the batch go at once, unacked; Faust's producer flush at stop is
        # bounded (it waited for the broker until the supervisor's SIGKILL, unsaid) and says what it left
        worker.stop()
        released = _events(worker, "state_writes_unconfirmed")
        assert released and "stops" in released[0]["why"], worker.tail(40)
        assert _events(worker, "stop_flush_timeout"), worker.tail(40)
        stack.start_component("kafka")
        assert not run.committed()   # nothing of the batch committed: its record is read again
        worker = run.start()
        wait_until(lambda: run.window(host) == 4, timeout=120, what="the batch read again after the restart")
        wait_until(lambda: run.state(host)[0], timeout=60, what="the host's state written")
        worker = run.restart_and_restore(worker)
        assert run.window(host) == 4   # its state, once
        assert _deadletters(run, host) == []
    finally:
        if not kafka.running():
            stack.start_component("kafka")
        worker.stop()
