"""Findings on their way to the broker: retried, in order per finding id, until the broker took them.

kafka-python's ``send`` raises when it cannot even queue a record (no metadata within
``max_block_ms``: broker away at the time) and otherwise returns a future that may fail later (the
batch expired). Either way the finding was not delivered, and a lost ``cleared`` leaves its page
open for good. So:

* per finding id a queue, sent head first, with one send in flight at a time: a retried ``opened``
  never arrives after the ``cleared`` that followed it (which would re-open the page);
* a failed send (raised, or its future failed) is counted (``opsloop_actuator_finding_send_failures_total``),
  logged (sampled) and retried with exponential back-off, capped. It is never given up: giving up on a
  ``cleared`` is the very bug. What is owed also survives a restart: the service keeps the fail-static
  state file until the clear is delivered (service.py);
* bounded: a state equal to the queue's tail (same incident, same open/cleared: a republished open)
  replaces it, and over ``max_per_id`` states the oldest not in flight is dropped (counted in
  ``opsloop_actuator_findings_dropped_total``, logged); the newest state of an id is never dropped.
  ``opsloop_actuator_findings_queued`` says how many wait;
* a future not resolved yet is waited for (kafka-python resolves each within ``delivery_timeout_ms``);
  a send that returns no future (a test double) counts as delivered.

The outbox is pumped by the caller (``put`` and each tick; ``add`` only queues): no thread of its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from opsloop.log import Sampled, get_logger
from opsloop.records import Finding

from opsloop.controllers.actuators import metrics

log = get_logger("actuator.outbox")
FAIL_LOG = Sampled(60.0)   # a broker away for long: one line a minute per finding id (the counter counts each)
MAX_PER_ID = 32


@dataclass
class _Queue:
    labels: tuple[str, str]      # (edge, listener) of the finding: the metrics' labels
    items: deque[Finding] = field(default_factory=deque)
    in_flight: Any = None        # the head's future, while the broker has not answered
    sending: bool = False        # the head was handed to the producer (its future is ``in_flight``)
    retry_at: float = 0.0        # monotonic
    delay_s: float = 0.0
    failures: int = 0            # failed sends of the head in a row (for the log)


def _labels(f: Finding) -> tuple[str, str]:
    return f.where.get("edge", ""), f.where.get("listener", "")


def _outcome(fut: Any) -> tuple[bool, BaseException | None]:
    """(answered, error) of a send's future: kafka-python's ``Future`` (``is_done``, ``exception``); no
    future (a test double's send) is an answer without error."""
    if fut is None or not hasattr(fut, "is_done"):
        return True, None
    return bool(fut.is_done), fut.exception if fut.is_done else None


def _same_state(a: Finding, b: Finding) -> bool:
    return (a.first_seen, a.cleared) == (b.first_seen, b.cleared)


class FindingOutbox:
    def __init__(self, send: Callable[[Finding], Any], on_delivered: Callable[[Finding, int], None], *,
                 backoff_initial_s: float, backoff_max_s: float, max_per_id: int = MAX_PER_ID) -> None:
        """``send`` hands a finding to the producer (its future, or raises); ``on_delivered(finding, left)``
        is told of each delivery with the number of states still queued for its id."""
        self._send = send
        self._on_delivered = on_delivered
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_per_id = max(2, max_per_id)
        self._queues: dict[str, _Queue] = {}

    def queued(self, finding_id: str) -> int:
        q = self._queues.get(finding_id)
        return len(q.items) if q else 0

    def queued_clears(self, finding_id: str) -> list[float]:
        """``first_seen`` of the clears of ``finding_id`` not delivered yet, oldest first."""
        q = self._queues.get(finding_id)
        return [f.first_seen for f in q.items if f.cleared] if q else []

    def __len__(self) -> int:
        return sum(len(q.items) for q in self._queues.values())

    def put(self, finding: Finding, now: float) -> None:
        """Queue ``finding`` behind its id's earlier states and send what is due now."""
        self.add(finding)
        self._pump_one(finding.id, self._queues[finding.id], now)

    def add(self, finding: Finding) -> None:
        """Queue ``finding`` behind its id's earlier states without sending it (the next ``put`` or ``pump``
        does): from its return on it is in ``queued_clears`` until delivered (or dropped over the bound)."""
        q = self._queues.get(finding.id)
        if q is None:
            q = self._queues[finding.id] = _Queue(_labels(finding))
        tail_free = len(q.items) > 1 or (len(q.items) == 1 and not q.sending)   # not the head in flight
        if tail_free and _same_state(q.items[-1], finding):
            q.items[-1] = finding     # the same state again, newer last_seen: one send is enough
        else:
            q.items.append(finding)
        if len(q.items) > self.max_per_id:
            # keep the head in flight (its answer is awaited) and the newest (the state that counts)
            dropped = q.items[1] if q.sending else q.items[0]
            q.items.remove(dropped)
            metrics.FINDINGS_DROPPED.labels(*q.labels).inc()
            log.error("finding_dropped", id=finding.id, first_seen=dropped.first_seen, cleared=dropped.cleared,
                      queued=len(q.items), why=f"more than {self.max_per_id} states waiting for the broker")

    def pump(self, now: float) -> None:
        """Collect the answers of sends in flight, deliver in order, retry what is due."""
        for fid, q in list(self._queues.items()):
            self._pump_one(fid, q, now)

    def _pump_one(self, fid: str, q: _Queue, now: float) -> None:
        while q.items:
            head = q.items[0]
            if q.sending:
                answered, error = _outcome(q.in_flight)
                if not answered:
                    break                                   # the broker has not answered yet
                q.sending, q.in_flight = False, None
                if error is not None:
                    self._failed(q, head, error, now)
                    break
                self._delivered(q, head)
                continue
            if now < q.retry_at:
                break
            try:
                q.in_flight = self._send(head)
            except Exception as e:  # noqa: BLE001 - metadata timeout, buffer full: retried, never raised
                self._failed(q, head, e, now)
                break
            q.sending = True
        if not q.items:
            del self._queues[fid]
        metrics.FINDINGS_QUEUED.labels(*q.labels).set(len(q.items))

    def _failed(self, q: _Queue, f: Finding, error: BaseException, now: float) -> None:
        q.failures += 1
        q.delay_s = min(self.backoff_max_s, max(self.backoff_initial_s, q.delay_s * 2))
        q.retry_at = now + q.delay_s
        metrics.FINDING_SEND_FAILURES.labels(*q.labels).inc()
        FAIL_LOG.warning(log, "finding_publish_failed", key=f.id, id=f.id, cleared=f.cleared, failures=q.failures,
                         queued=len(q.items), retry_in_s=q.delay_s, error=f"{type(error).__name__}: {error}"[:300])

    def _delivered(self, q: _Queue, f: Finding) -> None:
        q.items.popleft()
        if q.failures:
            log.info("finding_published_after_retries", id=f.id, cleared=f.cleared, failures=q.failures)
        q.failures, q.delay_s, q.retry_at = 0, 0.0, 0.0
        self._on_delivered(f, len(q.items))
