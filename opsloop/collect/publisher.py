"""Publishing collector rounds to Kafka: keyed, acks=all, idempotent, with the spool as fallback.

Guarantee: at-least-once per record, order kept per key. ``publish()`` never raises and never
blocks longer than ``send_timeout_s`` (plus one drain attempt): a record is either acknowledged
by the broker (acks=all) or written to the spool before ``publish()`` returns.

While the spool holds anything, new rounds go behind it (to the spool) so that a key's records
stay in order; each round then tries one drain. A failed send closes the producer with timeout 0,
which aborts its pending batches, so nothing the spool keeps can also be delivered later by the
old producer (a batch already on the wire when the broker died can still be duplicated: that is
the at-least-once part; the streams drop a series' samples whose timestamp does not advance).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from kafka import KafkaProducer
from prometheus_client import Counter, Gauge

from opsloop.collect.spool import Record, Spool
from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options, kafka_settings
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
SPOOL_DROPPED = Counter("opsloop_spool_dropped_records_total", "Records dropped because the spool was full",
                        ["collector"])
SPOOL_QUARANTINED = Counter("opsloop_spool_quarantined_lines_total",
                            "Spool lines that did not decode, moved to the spool's quarantine directory",
                            ["collector"])
PUBLISH_ERRORS = Counter("opsloop_collector_publish_errors_total",
                         "Rounds whose publishing failed unexpectedly (e.g. the spool's disk); the loop goes on",
                         ["collector"])
LOST = Counter("opsloop_collector_lost_records_total",
               "Records neither acknowledged nor spooled (the spool could not be written)", ["collector"])


MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0


# Kafka refuses a record above the broker's message.max.bytes (1 MB by default) for good; spooled, such
# a record would head the spool forever and hold every later round behind it. Records stay well under.
MAX_RECORD_BYTES = 512 * 1024


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
        self._producer: KafkaProducer | None = None
        # After a failed send, wait before the next attempt (doubling, capped) so that a dead broker
        # costs the collection loop one timeout per back-off period, not one per round.
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._update_gauges()

    # -- producer lifecycle ---------------------------------------------------------------
    def _get_producer(self) -> KafkaProducer:
        if self._producer is None:
            timeout_ms = int(self.send_timeout_s * 1000)
            self._producer = KafkaProducer(
                **client_options(self.kafka),
                client_id=self.client_id,
                acks="all",
                enable_idempotence=True,
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
        return self._producer

    def _drop_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)  # aborts pending batches: the spool owns them now
            except Exception:  # noqa: BLE001 - closing a broken producer must not fail the round
                pass
            self._producer = None

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout=self.send_timeout_s)
            finally:
                self._drop_producer()

    # -- sending --------------------------------------------------------------------------
    def _send(self, records: list[Record]) -> list[Record]:
        """Send and wait for acks; returns the records that failed (all of them if the broker is gone)."""
        if not records:
            return []
        try:
            producer = self._get_producer()
            futures = [(r, producer.send(self.kafka.topic(r.topic), key=r.key.encode(), value=r.value))
                       for r in records]
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
            except Exception as e:  # noqa: BLE001
                failed.append(r)
                last_error = e
        if failed:
            log.warning("kafka_send_failed", collector=self.collector, error=str(last_error), records=len(failed))
            SEND_FAILURES.labels(self.collector).inc()
            self._drop_producer()
        failed_ids = {id(r) for r in failed}
        self._count_sent([r for r in records if id(r) not in failed_ids])
        return failed

    def _count_sent(self, records: list[Record]) -> None:
        if records:
            PUBLISHED.labels(self.collector).inc(len(records))
            PUBLISHED_SAMPLES.labels(self.collector).inc(sum(r.value.count(b'"name":') for r in records))

    def publish_metrics(self, metrics: Iterable[Metric]) -> None:
        self.publish(records_for(metrics))

    def _note_result(self, ok: bool) -> None:
        if ok:
            self._backoff_s = 0.0
            self._retry_at = 0.0
        else:
            self._backoff_s = min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, self._backoff_s * 2))
            self._retry_at = time.monotonic() + self._backoff_s

    def publish(self, records: list[Record]) -> None:
        """Send or spool ``records``. Never raises: the collection loop must outlive a bad spool or disk."""
        spooled = False
        try:
            if not self.spool.empty() or time.monotonic() < self._retry_at:
                self.spool.append(records)
                spooled = True
                if time.monotonic() >= self._retry_at:
                    self.drain()
            else:
                failed = self._send(records)
                if failed:
                    self.spool.append(failed)
                self._note_result(not failed)
                spooled = True
        except Exception as e:  # noqa: BLE001 - counted and logged; the next round tries again
            PUBLISH_ERRORS.labels(self.collector).inc()
            if not spooled:
                LOST.labels(self.collector).inc(len(records))
            log.error("publish_failed", collector=self.collector, error=f"{type(e).__name__}: {e}",
                      records=len(records), spooled=spooled, exc_info=True)
        try:
            self._update_gauges()
        except Exception as e:  # noqa: BLE001
            log.error("spool_gauges_failed", collector=self.collector, error=str(e))

    def drain(self, budget_s: float | None = None) -> bool:
        """Replay the spool oldest-first until empty, a failure, or the budget; True when empty."""
        deadline = time.monotonic() + (budget_s if budget_s is not None else self.send_timeout_s)
        while True:
            item = self.spool.oldest()
            if item is None:
                self._update_gauges()
                return True
            path, records = item
            failed = self._send(records)
            self.spool.complete(path, failed)
            self._note_result(not failed)
            if failed:
                self._update_gauges()
                return False
            log.info("spool_replayed", collector=self.collector, records=len(records), segment=path.name)
            if time.monotonic() > deadline:
                self._update_gauges()
                return self.spool.empty()

    def _update_gauges(self) -> None:
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
        return {"spooled_records": self.spool.count_records(), "spool_bytes": self.spool.size_bytes(),
                "dropped": self.spool.dropped_records}
