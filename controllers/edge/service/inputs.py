"""The latest ``edge.demand`` record per (backend, edge), fed by a Kafka consumer thread.

The control loop only needs the newest demand of every edge, so the consumer starts at the end of
the topic (old demand is useless after a restart) and keeps one record per key.

No record may pin the book: one stamped further in the future than ``max_clock_skew_s`` is refused
(it would stay "newest" forever, hide every later record and never age into ``stale -> hold``),
counted in ``opsloop_edge_demand_rejected_total{reason="future"}``. Keys not updated for ``ttl_s``
are dropped (an LB or backend that went away), counted in ``opsloop_edge_demand_dropped_total{reason="ttl"}``;
a record older than the one kept (a replay, out of order) in ``{reason="superseded"}``. Keys the topology does not
read (``known``: every other backend's LBs, or a flood of bogus edge names) are kept at most ``max_unknown_keys``:
past that the least recently updated goes, ``{reason="unknown_cap"}`` (they were kept for ``ttl_s`` unbounded);
the known keys are never evicted so.

Partitions added to the topic while the service runs (``kafka-topics --alter --partitions``) are read from their
beginning once the consumer's metadata shows them (``metadata_max_age_ms``, 10 s), logged ``demand_partitions_added``:
the producers hash some keys onto them at once, and an edge whose demand moved there was never read again before (its
listener held, fail static, until a restart).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

from kafka import KafkaConsumer, TopicPartition

from opsloop.controllers.edge.service import metrics as M
from opsloop.config import KafkaSettings
from opsloop.kafka_clients import client_options, kafka_settings
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic
from opsloop.records import EdgeDemand

log = get_logger("controller.edge.inputs")
MAX_CLOCK_SKEW_S = 5.0
TTL_S = 3600.0
PRUNE_EVERY_S = 60.0
MAX_UNKNOWN_KEYS = 4096
# how soon partitions added to edge.demand are seen (kafka-python's default: 5 min of an edge's demand unread)
METADATA_MAX_AGE_MS = 10_000


class DemandBook:
    def __init__(self, max_clock_skew_s: float = MAX_CLOCK_SKEW_S, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.time, known: Iterable[tuple[str, str]] = (),
                 max_unknown_keys: int = MAX_UNKNOWN_KEYS) -> None:
        self._latest: dict[tuple[str, str], EdgeDemand] = {}
        self.known = frozenset(known)   # (backend, lb) the loop reads
        self.max_unknown_keys = max_unknown_keys
        self._unknown: OrderedDict[tuple[str, str], None] = OrderedDict()   # least recently updated first
        self._lock = threading.Lock()
        self.max_clock_skew_s = max_clock_skew_s
        self.ttl_s = ttl_s
        self.clock = clock
        self._pruned_at = clock()
        # a poison stream must not flood the log: one line per reason a minute (the counter counts each)
        self._reject_log = Sampled(clock=clock)
        self.received = 0
        self.rejected = 0

    def update(self, rec: EdgeDemand) -> bool:
        """Keep ``rec`` when it is the newest of its key; False when refused (from the future)."""
        now = self.clock()
        key = (rec.backend, rec.edge)
        if rec.timestamp > now + self.max_clock_skew_s:
            self.reject("future", backend=rec.backend, edge=rec.edge,
                        error=f"timestamp {rec.timestamp} is {rec.timestamp - now:.0f}s in the future "
                              f"(> max_clock_skew_s {self.max_clock_skew_s})")
            return False
        with self._lock:
            self.received += 1
            old = self._latest.get(key)
            if old is None or rec.timestamp >= old.timestamp:  # an at-least-once replay never goes back
                self._latest[key] = rec
                if key not in self.known:
                    self._keep_unknown(key)
            else:
                M.DEMAND_DROPPED.labels("superseded").inc()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._prune(now)
        return True

    def reject(self, reason: str, **fields: Any) -> None:
        """Count a refused record (``reason``: invalid, future) and log it, sampled per reason."""
        self.rejected += 1
        M.DEMAND_REJECTED.labels(reason).inc()
        self._reject_log.warning(log, "demand_record_rejected", key=reason, reason=reason, **fields)

    def _keep_unknown(self, key: tuple[str, str]) -> None:
        """Under the lock: ``key`` (not read by the loop) just updated; past ``max_unknown_keys`` the least
        recently updated unknown key goes."""
        self._unknown[key] = None
        self._unknown.move_to_end(key)
        evicted = 0
        while len(self._unknown) > self.max_unknown_keys:
            gone, _ = self._unknown.popitem(last=False)
            del self._latest[gone]
            evicted += 1
        if evicted:
            M.DEMAND_DROPPED.labels("unknown_cap").inc(evicted)
            self._reject_log.warning(log, "demand_unknown_keys_evicted", key="unknown_cap", evicted=evicted,
                                     max_unknown_keys=self.max_unknown_keys, backend=key[0], edge=key[1],
                                     consequence="demand of keys the topology does not read is forgotten")

    def _prune(self, now: float) -> None:
        """Under the lock: drop keys silent for ttl_s."""
        self._pruned_at = now
        old = [k for k, r in self._latest.items() if now - r.timestamp > self.ttl_s]
        for k in old:
            del self._latest[k]
            self._unknown.pop(k, None)
        if old:
            M.DEMAND_DROPPED.labels("ttl").inc(len(old))

    def get(self, backend: str, lb: str) -> EdgeDemand | None:
        with self._lock:
            return self._latest.get((backend, lb))

    def __len__(self) -> int:
        with self._lock:
            return len(self._latest)


class DemandConsumer:
    """Reads ``edge.demand`` from its end in a daemon thread into a :class:`DemandBook`."""

    def __init__(self, kafka: KafkaSettings | str, book: DemandBook, topic: str = Topic.EDGE_DEMAND.value,
                 deadletter: Callable[[Any, str], None] | None = None,
                 metadata_max_age_ms: int = METADATA_MAX_AGE_MS) -> None:
        self.kafka = kafka_settings(kafka)   # a bootstrap string means PLAINTEXT, no topic prefix
        self.metadata_max_age_ms = metadata_max_age_ms
        self.book = book
        self.deadletter = deadletter   # (consumer record, reason): where a record that is no demand goes
        self.topic = self.kafka.topic(topic)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.assigned = threading.Event()

    def start(self) -> "DemandConsumer":
        self._thread = threading.Thread(target=self._run, name="edge-demand-consumer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception as e:  # noqa: BLE001 - broker away: log, back off, reconnect
                log.warning("demand_consumer_error", error=f"{type(e).__name__}: {e}")
                self._stop.wait(2.0)

    def _consume(self) -> None:
        consumer = KafkaConsumer(**client_options(self.kafka), group_id=None, enable_auto_commit=False,
                                 client_id="opsloop-edge-controller", fetch_max_wait_ms=100,
                                 metadata_max_age_ms=self.metadata_max_age_ms)
        try:
            parts: set[int] | None = None
            while not self._stop.is_set() and not parts:
                parts = consumer.partitions_for_topic(self.topic)
                if not parts:
                    self._stop.wait(0.5)
            if self._stop.is_set():
                return
            tps = [TopicPartition(self.topic, p) for p in sorted(parts or ())]
            consumer.assign(tps)
            consumer.seek_to_end(*tps)
            for tp in tps:
                consumer.position(tp)  # resolve the end offset now, before records arrive
            self.assigned.set()
            while not self._stop.is_set():
                tps = self._grow(consumer, tps)
                for records in consumer.poll(timeout_ms=200).values():
                    for r in records:
                        try:
                            self.book.update(EdgeDemand.decode(r.value))
                        except ValueError as e:
                            self.book.reject("invalid", offset=r.offset, partition=r.partition,
                                             error=str(e)[:300])
                            if self.deadletter is not None:
                                self.deadletter(r, str(e))
        finally:
            consumer.close()

    def _grow(self, consumer: KafkaConsumer, tps: list[TopicPartition]) -> list[TopicPartition]:
        """``tps`` plus the partitions added to the topic since (read from their beginning: their first records
        came before the metadata showed them); read from the cached metadata while the topic is in it."""
        known = {tp.partition for tp in tps}
        added = sorted(p for p in consumer.partitions_for_topic(self.topic) or () if p not in known)
        if not added:
            return tps
        new = [TopicPartition(self.topic, p) for p in added]
        consumer.assign(tps + new)   # kept partitions keep their positions
        consumer.seek_to_beginning(*new)
        log.warning("demand_partitions_added", topic=self.topic, partitions=added, total=len(tps) + len(new),
                    consequence="their demand is read from their beginning")
        return tps + new
