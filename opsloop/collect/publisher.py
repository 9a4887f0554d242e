"""Publishing collector rounds to Kafka: keyed, acks=all, one request in flight, with the spool as fallback.

The collection loop never waits for the broker. ``publish()`` hands a round to this publisher's
sender thread and returns: in memory when the sender is idle and healthy (the common case: no disk
write), otherwise durably to the spool (the sender is busy, draining, or backing off after a
failure). A broker that hangs or dies mid-send costs the sender ``send_timeout_s``, not the loop:
the rounds collected meanwhile go to the spool at their interval. (The publisher used to send on
the loop's thread; a broker killed during a send stalled a collector 21 s at a 2 s interval.)

Guarantee: at-least-once per record, order kept per key. Every round gets a sequence number when
it is handed over; the sender sends the lowest first, and a round sent from memory that fails is
written to the spool under its own number, so it is replayed ahead of the rounds spooled while it
was in flight. A failed send closes the producer with timeout 0, which aborts its pending batches,
so nothing the spool keeps can also be delivered later by the old producer (a batch already on the
wire when the broker died can still be duplicated: that is the at-least-once part; the streams drop
a series' samples whose timestamp does not advance). What only memory holds is the round being sent
and, while the spool's disk refuses writes, up to ``MEMORY_MAX_BYTES`` of rounds (oldest dropped and
counted lost beyond it): a collector killed at that moment loses those, as it lost a round in flight
when sending was synchronous.

A record the broker refuses for good (``REFUSED_FOR_GOOD``: over the topic's ``max.message.bytes``, a topic
this collector may not write, a timestamp or record the broker rejects) is not spooled: sent again it would
be refused again, head the spool forever and hold every later round of every topic behind it. It is counted
lost and logged (``record_refused``, with its topic, key and size); the other records of the round go on.
The producer is not idempotent (:func:`opsloop.kafka_clients.service_producer`): kafka-python's idempotent
producer took one such refusal as fatal and failed every other record of the flush with the same error.

The topics a round goes to are created if missing (``kafka.partitions``, ``kafka.replication_factor``) before the
first send to them, once a producer reached a broker. A collector started before the stream worker (which creates
them too) sent to topics that did not exist: kafka-python logged "Topic ... not found in cluster metadata", the
broker auto-created them with its own partition count (the stream stage's parallelism and key placement then not
the configured ones) and, on brokers that do not auto-create, every send blocked ``max_block_ms``. Not allowed to
create (ACLs): ``topics_not_created`` is logged and sending goes on with what exists; tried again with the next
producer (after a failed send).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kafka import KafkaProducer
from kafka.errors import (CorruptRecordError, InvalidRecordError, InvalidTimestampError, InvalidTopicError,
                          MessageSizeTooLargeError, PolicyViolationError, RecordListTooLargeError,
                          TopicAuthorizationFailedError)
from prometheus_client import Counter, Gauge

from opsloop.collect.spool import Record, Spool
from opsloop.config import KafkaSettings
from opsloop.kafka_admin import ensure_configured_topics
from opsloop.kafka_clients import kafka_settings, service_producer
from opsloop.log import get_logger
from opsloop.records import Metric
from opsloop.wire import encode_batch, group_by_route

log = get_logger("publisher")

PUBLISHED = Counter("opsloop_collector_published_records_total", "Records acknowledged by Kafka", ["collector"])
PUBLISHED_SAMPLES = Counter("opsloop_collector_published_samples_total", "Samples in acknowledged records",
                            ["collector"])
SEND_FAILURES = Counter("opsloop_collector_send_failures_total", "Send attempts that failed (broker unreachable)",
                        ["collector"])
SPOOLED = Gauge("opsloop_spool_records", "Records waiting in the on-disk spool", ["collector"])
SPOOL_BYTES = Gauge("opsloop_spool_bytes", "Bytes in the on-disk spool", ["collector"])
SPOOL_DROPPED = Counter("opsloop_spool_dropped_records_total",
                        "Records dropped because the spool was full, or lost with its directory removed",
                        ["collector"])
SPOOL_QUARANTINED = Counter("opsloop_spool_quarantined_lines_total",
                            "Spool lines that did not decode, moved to the spool's quarantine directory",
                            ["collector"])
PUBLISH_ERRORS = Counter("opsloop_collector_publish_errors_total",
                         "Rounds whose publishing failed unexpectedly (e.g. the spool's disk); the loop goes on",
                         ["collector"])
LOST = Counter("opsloop_collector_lost_records_total",
               "Records neither acknowledged nor spooled: refused by the broker for good, or the spool could not be "
               "written and memory was full", ["collector"])


MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
# Rounds held in memory while the spool's disk refuses writes (and the sender is busy or failing).
MEMORY_MAX_BYTES = 32 * 1024 * 1024


# Kafka refuses a record above the broker's message.max.bytes (1 MB by default) for good; spooled, such
# a record would head the spool forever and hold every later round behind it. Records stay well under.
MAX_RECORD_BYTES = 512 * 1024

# The broker's refusals of a record itself: sent again, it is refused again (retrying cannot help). Other
# errors (a broker away, a leader moving, a timeout) leave the record in the spool for the next try.
REFUSED_FOR_GOOD = (MessageSizeTooLargeError, RecordListTooLargeError, InvalidTopicError,
                    TopicAuthorizationFailedError, PolicyViolationError, InvalidTimestampError, CorruptRecordError,
                    InvalidRecordError)


def _encode_within(topic: str, key: str, ms: list[Metric], limit: int) -> list[Record]:
    """``ms`` as one record, or cut in halves (order kept, same key) until each is under ``limit``."""
    value = encode_batch(ms)
    if len(value) <= limit or len(ms) == 1:
        return [Record(topic, key, value)]
    half = len(ms) // 2
    return _encode_within(topic, key, ms[:half], limit) + _encode_within(topic, key, ms[half:], limit)


def records_for(metrics: Iterable[Metric], limit: int = MAX_RECORD_BYTES) -> list[Record]:
    """One record per (topic, key): a round travels as few, large messages (Telegraf batch shape),
    a group larger than ``limit`` bytes as several records of that key, in order."""
    return [r for (topic, key), ms in group_by_route(metrics).items()
            for r in _encode_within(topic.value, key, ms, limit)]


@dataclass(slots=True)
class _Round:
    """A round handed over in memory, with the spool sequence number it would be (or is) spooled under."""
    seq: int
    records: list[Record]

    @property
    def nbytes(self) -> int:
        return sum(len(r.value) for r in self.records)


class Publisher:
    def __init__(self, kafka: KafkaSettings | str, spool_dir: Path, *, collector: str = "collector",
                 client_id: str = "opsloop-collector", spool_max_bytes: int = 256 * 1024 * 1024,
                 send_timeout_s: float = 10.0) -> None:
        # A bootstrap string means PLAINTEXT, no topic prefix. The spool keeps base topic names; the
        # prefix is applied when sending, so a spool survives a prefix change without re-writing.
        self.kafka = kafka_settings(kafka)
        self.collector = collector
        self.client_id = client_id
        self.send_timeout_s = send_timeout_s
        self.spool = Spool(spool_dir, spool_max_bytes)
        self._quarantined_seen = 0
        self._dropped_seen = 0
        SPOOL_DROPPED.labels(collector)   # the series exists at 0 before the first drop
        self._producer: KafkaProducer | None = None   # the sender thread's
        # Base topic names of the rounds: checked (exist or created) once; a check that failed (no right to
        # create, say) is not repeated with the same producer, but with the next one (sender thread only).
        self._topics_seen: set[str] = set()
        self._topics_checked: set[str] = set()
        self._topics_failed: set[str] = set()
        # One condition guards what both threads touch: the memory queue, the sender's state, back-off.
        self._cv = threading.Condition()
        self._memory: deque[_Round] = deque()
        self._memory_bytes = 0
        self._busy = False        # the sender holds a round or a segment in flight
        self._failures = 0        # sends that failed so far (flush() returns False on a new one)
        self._closing = False
        # After a failed send, wait before the next attempt (doubling, capped): a dead broker costs one
        # timeout per back-off period.
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._update_gauges()
        self._sender = threading.Thread(target=self._run, name=f"publish-{collector}", daemon=True)
        self._sender.start()   # a spool left by an earlier run is replayed from the start

    # -- producer lifecycle (sender thread) -----------------------------------------------
    def _get_producer(self) -> KafkaProducer:
        if self._producer is None:
            timeout_ms = int(self.send_timeout_s * 1000)
            self._producer = service_producer(
                self.kafka,
                self.client_id,
                linger_ms=20,
                batch_size=256 * 1024,
                max_request_size=4 * 1024 * 1024,
                compression_type=None,
                max_block_ms=timeout_ms,
                request_timeout_ms=max(1000, timeout_ms // 2),
                delivery_timeout_ms=timeout_ms,
                bootstrap_timeout_ms=timeout_ms,
                reconnect_backoff_max_ms=1000,
            )
        if self._topics_seen - self._topics_checked:
            self._ensure_topics()   # after the producer's bootstrap: a broker answers (bounded admin waits)
        return self._producer

    def _ensure_topics(self) -> None:
        """Create the missing topics of the rounds seen so far (see the module's docstring); never raises."""
        topics = sorted(self._topics_seen - self._topics_checked)
        self._topics_checked.update(topics)
        if not ensure_configured_topics(self.kafka, log, topics, timeout_s=self.send_timeout_s,
                                        collector=self.collector):
            self._topics_failed.update(topics)

    def _drop_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)  # aborts pending batches: the spool owns them now
            except Exception:  # noqa: BLE001 - closing a broken producer must not fail the round
                pass
            self._producer = None
        # topics whose check failed are checked again with the next producer (the broker may be back, or fixed)
        self._topics_checked -= self._topics_failed
        self._topics_failed.clear()

    # -- the collection loop's side ---------------------------------------------------------
    def publish_metrics(self, metrics: Iterable[Metric]) -> None:
        self.publish(records_for(metrics))

    def publish(self, records: list[Record]) -> None:
        """Hand ``records`` to the sender; never raises, never waits for the broker (at most for one
        spool write): the collection loop must outlive a dead broker, a bad spool or a full disk."""
        if not records:
            return
        try:
            with self._cv:
                seq = self.spool.reserve()
                if not (self._busy or self._memory or self._in_backoff() or self._closing
                        or not self.spool.empty()):   # after close() no sender: the spool keeps it
                    self._hold(_Round(seq, records))
                    self._cv.notify_all()
                    return
            self._spool_or_lose(_Round(seq, records))   # a refusing disk: held in memory (bounded)
            with self._cv:
                self._cv.notify_all()
        except Exception as e:  # noqa: BLE001 - counted and logged; the next round tries again
            PUBLISH_ERRORS.labels(self.collector).inc()
            LOST.labels(self.collector).inc(len(records))
            log.error("publish_failed", collector=self.collector, error=f"{type(e).__name__}: {e}",
                      records=len(records), exc_info=True)
        self._update_gauges_safely()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything handed over so far is acknowledged (True), or a send fails, or
        ``timeout_s`` (default ``send_timeout_s``) passes (False; what is unsent stays queued). In
        back-off (the broker is known unreachable) it does not wait: a stop must not hang on it."""
        deadline = time.monotonic() + (self.send_timeout_s if timeout_s is None else timeout_s)
        with self._cv:
            failures = self._failures
            while not self._idle():
                left = deadline - time.monotonic()
                if left <= 0 or self._failures != failures or self._in_backoff() or not self._sender.is_alive():
                    return False
                self._cv.wait(min(left, 0.5))
            return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush (within ``timeout_s``), stop the sender, spool what memory still holds; True when
        everything was acknowledged. What is left is in the spool for the next start."""
        delivered = self.flush(timeout_s)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        # a send in flight ends within its own timeouts: bootstrap, the topics' check (listed, then created),
        # a blocking send(), then flush()
        self._sender.join(5 * self.send_timeout_s + 5.0)
        if self._sender.is_alive():
            log.error("publisher_close_timed_out", collector=self.collector,
                      error="the sender is still in a send; its round may be lost")
        with self._cv:
            left, self._memory = list(self._memory), deque()
            self._memory_bytes = 0
        for rnd in left:
            self._spool_or_lose(rnd)
        self._drop_producer()
        self._update_gauges_safely()
        return delivered

    # -- the sender thread -----------------------------------------------------------------
    def _idle(self) -> bool:
        return not self._busy and not self._memory and self.spool.empty()

    def _in_backoff(self) -> bool:
        return time.monotonic() < self._retry_at

    def _run(self) -> None:
        while self._wait_for_work():
            rnd: _Round | None = None
            try:
                with self._cv:
                    rnd = self._next_from_memory()
                    self._busy = True
                self._send_next(rnd)
            except Exception as e:  # noqa: BLE001 - a bug or a disk error must not end the sender
                PUBLISH_ERRORS.labels(self.collector).inc()
                log.error("publish_failed", collector=self.collector, error=f"{type(e).__name__}: {e}",
                          exc_info=True)
                with self._cv:
                    if rnd is not None:   # taken from memory and not settled: back in line (at-least-once)
                        self._hold(rnd, front=True)
                    self._note_result(False)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
                self._update_gauges_safely()

    def _wait_for_work(self) -> bool:
        """Block until there is something to send and no back-off; False when closing."""
        with self._cv:
            while not self._closing:   # close() flushed first: what is left is spooled by close()
                pending = bool(self._memory) or not self.spool.empty()
                if pending and not self._in_backoff():
                    return True
                self._cv.wait(min(1.0, max(0.01, self._retry_at - time.monotonic())) if pending else None)
            return False

    def _next_from_memory(self) -> _Round | None:
        """The memory queue's head when it comes before the spool's oldest segment, else None (the spool)."""
        if not self._memory:
            return None
        first = self.spool.first_seq()
        if first is not None and first < self._memory[0].seq:
            return None
        rnd = self._memory.popleft()
        self._memory_bytes -= rnd.nbytes
        return rnd

    def _send_next(self, rnd: _Round | None) -> None:
        if rnd is not None:
            failed = self._send(rnd.records)
            if failed:
                self._spool_or_lose(_Round(rnd.seq, failed), front=True)
        else:
            item = self.spool.oldest()
            if item is None:
                return
            path, records = item
            with self._cv:
                # The pick compared the memory head with the oldest segment then; a segment that vanished
                # since (quarantined whole, dropped by the bound) makes oldest() return a later one, which
                # must not overtake a round held in memory: back to the pick, which now takes memory first.
                if self._memory and self._memory[0].seq < int(path.stem):
                    return
            failed = self._send(records)
            self.spool.complete(path, failed)
            if not failed:
                log.info("spool_replayed", collector=self.collector, records=len(records), segment=path.name)
        with self._cv:
            self._note_result(not failed)

    def _send(self, records: list[Record]) -> list[Record]:
        """Send and wait for acks; returns the records to try again (all of them if the broker is gone).
        Records the broker refuses for good are counted lost, not returned (see the module's docstring)."""
        refused: list[tuple[Record, Exception]] = []
        try:
            self._topics_seen.update(r.topic for r in records)   # checked by _get_producer (_ensure_topics)
            producer = self._get_producer()
            futures = []
            for r in records:
                try:
                    futures.append((r, producer.send(self.kafka.topic(r.topic), key=r.key.encode(), value=r.value)))
                except REFUSED_FOR_GOOD as e:   # over the producer's own max_request_size: never sendable
                    refused.append((r, e))
            producer.flush(timeout=self.send_timeout_s)
        except Exception as e:  # noqa: BLE001 - any client error means "not delivered"
            log.warning("kafka_send_failed", collector=self.collector, error=str(e), records=len(records))
            SEND_FAILURES.labels(self.collector).inc()
            self._drop_producer()
            return records
        failed: list[Record] = []
        last_error: Exception | None = None
        for r, fut in futures:
            try:
                fut.get(timeout=0)
            except REFUSED_FOR_GOOD as e:
                refused.append((r, e))
            except Exception as e:  # noqa: BLE001
                failed.append(r)
                last_error = e
        if failed:
            log.warning("kafka_send_failed", collector=self.collector, error=str(last_error), records=len(failed))
            SEND_FAILURES.labels(self.collector).inc()
            self._drop_producer()
        for r, e in refused:
            LOST.labels(self.collector).inc()
            log.error("record_refused", collector=self.collector, topic=self.kafka.topic(r.topic), key=r.key[:200],
                      bytes=len(r.value), error=f"{type(e).__name__}: {e}"[:300])
        gone = {id(r) for r in failed} | {id(r) for r, _ in refused}
        self._count_sent([r for r in records if id(r) not in gone])
        return failed

    def _count_sent(self, records: list[Record]) -> None:
        if records:
            PUBLISHED.labels(self.collector).inc(len(records))
            PUBLISHED_SAMPLES.labels(self.collector).inc(sum(r.value.count(b'"name":') for r in records))

    def _note_result(self, ok: bool) -> None:
        if ok:
            self._backoff_s = 0.0
            self._retry_at = 0.0
        else:
            self._failures += 1
            self._backoff_s = min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, self._backoff_s * 2))
            self._retry_at = time.monotonic() + self._backoff_s

    def _spool_or_lose(self, rnd: _Round, *, front: bool = False) -> None:
        """Spool an unsent round under its sequence number; if the disk refuses, hold it in memory
        (after close() there is no sender: counted lost)."""
        try:
            self.spool.append(rnd.records, seq=rnd.seq)
        except OSError as e:
            PUBLISH_ERRORS.labels(self.collector).inc()
            log.error("spool_write_failed", collector=self.collector, error=f"{type(e).__name__}: {e}",
                      records=len(rnd.records), held_in_memory=not self._closing)
            with self._cv:
                if self._closing:
                    LOST.labels(self.collector).inc(len(rnd.records))
                else:
                    self._hold(rnd, front=front)

    def _hold(self, rnd: _Round, *, front: bool = False) -> None:
        """Keep ``rnd`` in memory (under the condition), dropping the oldest rounds past MEMORY_MAX_BYTES."""
        if front:
            self._memory.appendleft(rnd)
        else:
            self._memory.append(rnd)
        self._memory_bytes += rnd.nbytes
        while self._memory_bytes > MEMORY_MAX_BYTES and len(self._memory) > 1:
            old = self._memory.popleft()
            self._memory_bytes -= old.nbytes
            LOST.labels(self.collector).inc(len(old.records))
            log.error("memory_queue_full", collector=self.collector, dropped_records=len(old.records))

    # -- gauges ------------------------------------------------------------------------------
    def _update_gauges_safely(self) -> None:
        try:
            self._update_gauges()
        except Exception as e:  # noqa: BLE001
            log.error("spool_gauges_failed", collector=self.collector, error=str(e))

    def _update_gauges(self) -> None:
        with self._cv:   # both threads update: the counters' "seen" marks must not be raced
            SPOOLED.labels(self.collector).set(self.spool.count_records())
            SPOOL_BYTES.labels(self.collector).set(self.spool.size_bytes())
            dropped = self.spool.dropped_records - self._dropped_seen
            if dropped > 0:   # a counter: only the drops since the last update are added
                SPOOL_DROPPED.labels(self.collector).inc(dropped)
                self._dropped_seen = self.spool.dropped_records
            new = self.spool.quarantined_lines - self._quarantined_seen
            if new > 0:
                SPOOL_QUARANTINED.labels(self.collector).inc(new)
                self._quarantined_seen = self.spool.quarantined_lines

    def stats(self) -> dict[str, Any]:
        with self._cv:   # the sender mutates the deque: iterating it unlocked can raise
            memory_records = sum(len(r.records) for r in self._memory)
        return {"spooled_records": self.spool.count_records(), "spool_bytes": self.spool.size_bytes(),
                "dropped": self.spool.dropped_records, "memory_records": memory_records}
