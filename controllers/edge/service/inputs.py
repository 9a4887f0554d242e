"""The latest ``edge.demand`` record per (backend, edge), fed by a Kafka consumer thread.

The control loop only needs the newest demand of every edge, so the consumer starts at the end of
the topic (old demand is useless after a restart) and keeps one record per key.
"""

from __future__ import annotations

import threading
import time

from kafka import KafkaConsumer, TopicPartition

from opsloop.log import get_logger
from opsloop.wire import Topic
from streams.edge.demand import EdgeDemand

log = get_logger("controller.edge.inputs")


class DemandBook:
    def __init__(self) -> None:
        self._latest: dict[tuple[str, str], EdgeDemand] = {}
        self._lock = threading.Lock()
        self.received = 0
        self.rejected = 0

    def update(self, rec: EdgeDemand, received_at: float | None = None) -> None:
        # Age counts from the receive time too: a record stamped in the future (a skewed clock)
        # is kept as received now, so it ages and goes stale instead of pinning the book forever.
        received_at = time.time() if received_at is None else received_at
        if rec.timestamp > received_at:
            rec = rec.model_copy(update={"timestamp": received_at})
        key = (rec.backend, rec.edge)
        with self._lock:
            self.received += 1
            old = self._latest.get(key)
            if old is None or rec.timestamp >= old.timestamp:  # an at-least-once replay never goes back
                self._latest[key] = rec

    def get(self, backend: str, lb: str) -> EdgeDemand | None:
        with self._lock:
            return self._latest.get((backend, lb))


class DemandConsumer:
    """Reads ``edge.demand`` from its end in a daemon thread into a :class:`DemandBook`."""

    def __init__(self, bootstrap: str, book: DemandBook, topic: str = Topic.EDGE_DEMAND.value) -> None:
        self.bootstrap = bootstrap
        self.book = book
        self.topic = topic
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
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                 client_id="opsloop-edge-controller", fetch_max_wait_ms=100)
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
                for records in consumer.poll(timeout_ms=200).values():
                    for r in records:
                        try:
                            self.book.update(EdgeDemand.decode(r.value))
                        except ValueError as e:
                            self.book.rejected += 1
                            log.warning("demand_record_rejected", offset=r.offset, partition=r.partition,
                                        error=str(e)[:300])
        finally:
            consumer.close()

