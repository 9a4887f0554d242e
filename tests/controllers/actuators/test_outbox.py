"""The findings outbox alone (``outbox.py``): order per finding id with one send in flight, back-off,
the same state said twice sent once, the bound (oldest dropped, the newest never)."""

from __future__ import annotations

from kafka.errors import KafkaTimeoutError
from kafka.future import Future

from opsloop.records import Finding

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.outbox import FindingOutbox
from tests.helpers import unique


def _finding(edge: str, first: float, cleared: bool, last: float | None = None) -> Finding:
    return Finding(detector="edge.fail_static", what="held", where={"listener": "web", "edge": edge},
                   first_seen=first, last_seen=last or first, cleared=cleared)


class Broker:
    def __init__(self) -> None:
        self.mode = "up"                     # up | raise | pending
        self.took: list[tuple[float, bool]] = []
        self.futures: list[tuple[Future, Finding]] = []

    def send(self, f: Finding) -> Future | None:
        if self.mode == "raise":
            raise KafkaTimeoutError("no metadata")
        if self.mode == "pending":
            fut = Future()
            self.futures.append((fut, f))
            return fut
        self.took.append((f.first_seen, f.cleared))
        return None

    def answer(self, ok: bool) -> None:
        futures, self.futures = self.futures, []
        for fut, f in futures:
            if ok:
                self.took.append((f.first_seen, f.cleared))
                fut.success(None)
            else:
                fut.failure(KafkaTimeoutError("batch expired"))


def _outbox(broker: Broker, delivered: list[tuple[float, bool, int]], max_per_id: int = 32) -> FindingOutbox:
    return FindingOutbox(broker.send, lambda f, left: delivered.append((f.first_seen, f.cleared, left)),
                         backoff_initial_s=1.0, backoff_max_s=4.0, max_per_id=max_per_id)


def test_one_send_in_flight_per_id_keeps_the_order_and_a_failure_is_retried_after_a_backoff() -> None:
    edge, broker, delivered = unique("ob"), Broker(), []
    box = _outbox(broker, delivered)
    broker.mode = "pending"
    box.put(_finding(edge, 1.0, False), now=0.0)
    box.put(_finding(edge, 1.0, True), now=0.0)          # waits behind the open in flight
    assert len(broker.futures) == 1 and box.queued(_finding(edge, 1.0, False).id) == 2
    broker.answer(ok=False)
    box.pump(now=0.5)                                    # failed: retried 1 s after, not before
    assert broker.futures == [] and metrics.FINDING_SEND_FAILURES.labels(edge, "web")._value.get() == 1
    broker.mode = "up"
    box.pump(now=1.4)
    assert broker.took == []
    box.pump(now=1.5)
    assert broker.took == [(1.0, False), (1.0, True)] and [d[2] for d in delivered] == [1, 0]
    assert len(box) == 0 and metrics.FINDINGS_QUEUED.labels(edge, "web")._value.get() == 0


def test_back_off_doubles_to_its_cap_and_a_raising_send_is_never_given_up() -> None:
    edge, broker, delivered = unique("ob"), Broker(), []
    box = _outbox(broker, delivered)
    broker.mode = "raise"
    box.put(_finding(edge, 1.0, True), now=0.0)
    tried = []
    for t in range(0, 60):
        before = metrics.FINDING_SEND_FAILURES.labels(edge, "web")._value.get()
        box.pump(now=float(t))
        if metrics.FINDING_SEND_FAILURES.labels(edge, "web")._value.get() > before:
            tried.append(t)
    assert tried[:5] == [1, 3, 7, 11, 15] and len(box) == 1
    broker.mode = "up"
    box.pump(now=100.0)
    assert broker.took == [(1.0, True)] and len(box) == 0


def test_the_same_state_again_is_sent_once_and_the_bound_drops_the_oldest_never_the_newest() -> None:
    edge, broker, delivered = unique("ob"), Broker(), []
    box = _outbox(broker, delivered, max_per_id=3)
    broker.mode = "raise"
    box.put(_finding(edge, 1.0, False), now=0.0)
    box.put(_finding(edge, 1.0, False, last=5.0), now=0.0)   # said again (a restart): replaces the tail
    assert box.queued(_finding(edge, 1.0, False).id) == 1
    box.put(_finding(edge, 1.0, True), now=0.0)
    box.put(_finding(edge, 2.0, False), now=0.0)
    box.put(_finding(edge, 3.0, False), now=0.0)
    # queue: open 1, clear 1, open 2, open 3 -> over 3: the oldest (open 1) dropped
    assert metrics.FINDINGS_DROPPED.labels(edge, "web")._value.get() == 1
    broker.mode = "up"
    box.pump(now=10.0)
    assert broker.took == [(1.0, True), (2.0, False), (3.0, False)]
