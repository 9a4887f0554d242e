"""Publish audit records to the Kafka ``audit`` topic (optional sink; keyed by target).

The topic is for other consumers (a SIEM, a second indexer); opsloop's own Elasticsearch indexer
does not depend on it. An actuator must never wait for this sink nor fail because the topic is
unreachable, so ``submit`` only queues (bounded, in memory): one sender thread builds the producer
(retrying while no broker answers: kafka-python asks for API versions when it is built) and sends in
order. A send that raises (metadata unknown, buffer full) is retried with back-off, the record kept at
the head; a record Kafka does not acknowledge is counted and logged; a full queue drops its oldest.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

from kafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from opsloop.records import AuditRecord
from opsloop.config import KafkaSettings
from opsloop.kafka_clients import connect_with_retry, kafka_settings, service_producer
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic

log = get_logger("audit.kafka")
DROP_LOG = Sampled(60.0)   # a full queue drops a record per submit: one line a minute, the counter counts each

PUBLISHED = Counter("opsloop_audit_published_total", "Audit records acknowledged by Kafka", ["topic"])
PUBLISH_FAILURES = Counter("opsloop_audit_publish_failures_total", "Audit records Kafka did not acknowledge",
                           ["topic"])
DROPPED = Counter("opsloop_audit_publish_dropped_total",
                  "Audit records never sent to Kafka (the queue full, or still queued at close)", ["topic"])
QUEUED = Gauge("opsloop_audit_publish_queued_records", "Audit records waiting to be sent to Kafka", ["topic"])

MAX_QUEUED = 10_000        # ~1 KB a record: a broker outage costs at most ~10 MB
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0


class KafkaAuditPublisher:
    def __init__(self, kafka: KafkaSettings | str, topic: str = Topic.AUDIT.value, client_id: str = "opsloop-audit",
                 producer_factory: Callable[[], Any] | None = None, max_queued: int = MAX_QUEUED,
                 retry_max_s: float = RETRY_MAX_S) -> None:
        k = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.topic = k.topic(topic)
        self._factory = producer_factory or (lambda: _kafka_producer(k, client_id))
        self._max_queued = max_queued
        self._retry_max_s = retry_max_s
        self._queue: deque[AuditRecord] = deque()
        self._in_flight = 0                # handed to the producer, not yet acknowledged or failed
        self._producer: Any = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-kafka-sender", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the actuator's side

    def submit(self, record: AuditRecord) -> None:
        with self._cond:
            if self._stop.is_set():
                self._drop(1, "closed")
                return
            if len(self._queue) >= self._max_queued:
                self._queue.popleft()
                self._drop(1, "queue full")
            self._queue.append(record)
            QUEUED.labels(self.topic).set(len(self._queue))
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is acknowledged or failed; False if ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                if not self._queue and not self._in_flight:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                producer = self._producer if not self._queue else None
                if producer is None:
                    self._cond.wait(min(left, 0.1))
                    continue
            try:        # all sent: the producer's own flush waits for the acknowledgements
                producer.flush(timeout=left)
            except Exception as e:  # noqa: BLE001 - a timed-out flush is a False, not an error
                log.warning("audit_flush_failed", topic=self.topic, error=f"{type(e).__name__}: {e}"[:300])
            with self._cond:
                if self._in_flight:   # callbacks still running on the producer's thread
                    self._cond.wait(min(max(0.0, deadline - time.monotonic()), 0.1))

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush for at most ``timeout_s``, then stop; what is still queued is counted dropped, not waited for."""
        self.flush(timeout_s)
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        self._thread.join(timeout=max(1.0, timeout_s))
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
            QUEUED.labels(self.topic).set(0)
            producer, self._producer = self._producer, None
        if left:
            self._drop(left, "closed")
        if producer is not None:
            try:
                producer.close(timeout=timeout_s)
            except Exception as e:  # noqa: BLE001
                log.warning("audit_close_failed", topic=self.topic, error=f"{type(e).__name__}: {e}"[:300])

    # ------------------------------------------------------------------ the sender thread

    def _run(self) -> None:
        if not connect_with_retry(self._connect, self._stop, "audit-kafka", log, RETRY_INITIAL_S, self._retry_max_s):
            return
        delay = RETRY_INITIAL_S
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                record = self._queue[0]
            if self._send(record):
                delay = RETRY_INITIAL_S
                continue
            self._stop.wait(delay)            # the record stays at the head: order kept
            delay = min(delay * 2, self._retry_max_s)

    def _connect(self) -> None:
        try:
            producer = self._factory()
        except (KafkaError, OSError):
            raise
        except Exception as e:  # noqa: BLE001 - whatever the client raised: retried like an absent broker
            raise KafkaError(f"{type(e).__name__}: {e}") from e
        with self._cond:
            if not self._stop.is_set():
                self._producer = producer
                self._cond.notify_all()
                return
        producer.close(timeout=0)      # built after close(): nobody would close it

    def _send(self, record: AuditRecord) -> bool:
        try:
            fut = self._producer.send(self.topic, key=(record.edge or record.target).encode(), value=record.encode())
        except Exception as e:  # noqa: BLE001 - metadata timeout, buffer full: retried, never raised
            log.warning("audit_publish_retry", topic=self.topic, id=record.id, error=f"{type(e).__name__}: {e}"[:300])
            return False
        with self._cond:
            if self._queue and self._queue[0] is record:   # close() may have cleared the queue meanwhile
                self._queue.popleft()
            QUEUED.labels(self.topic).set(len(self._queue))
            self._in_flight += 1
        fut.add_callback(lambda _md: self._done(record, None))
        fut.add_errback(lambda e: self._done(record, e))
        return True

    def _done(self, record: AuditRecord, error: BaseException | None) -> None:
        if error is None:
            PUBLISHED.labels(self.topic).inc()
        else:
            PUBLISH_FAILURES.labels(self.topic).inc()
            log.warning("audit_publish_failed", topic=self.topic, id=record.id,
                        error=f"{type(error).__name__}: {error}"[:300])
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def _drop(self, n: int, why: str) -> None:
        DROPPED.labels(self.topic).inc(n)
        DROP_LOG.warning(log, "audit_publish_dropped", key=f"{self.topic}|{why}", topic=self.topic, records=n, why=why)


def _kafka_producer(k: KafkaSettings, client_id: str) -> Any:
    return service_producer(k, client_id, linger_ms=5, request_timeout_ms=10_000, max_block_ms=5_000)
