"""The Kafka audit sink never makes an actuator wait: a broker away at start, a send that blocks, a send
that raises and a full queue, against a fake producer (the real topic: tests/core/audit/test_es.py).

Before, the constructor built a KafkaProducer on the caller's thread (blocking until kafka-python gave up
on the API-version probe, then raising: the actuator never started) and ``submit`` called
``producer.send`` there (blocking up to ``max_block_ms`` per record while metadata was unknown).
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any, Callable

from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from prometheus_client import REGISTRY

from opsloop.audit.kafka import KafkaAuditPublisher
from opsloop.audit.trail import AuditLog
from opsloop.records import AuditRecord
from opsloop.stack import free_port
from tests.helpers import unique

T0 = datetime(2026, 11, 30, 3, 12, 4, tzinfo=timezone.utc).timestamp()
GUARD_S = 20     # a liveness guard (a hang fails the test instead of the suite), not a timing claim


def _rec(i: int) -> AuditRecord:
    return AuditRecord.build(actor="controller.edge", action="edge.weights.push", target="haproxy:ams/app",
                             edge="ams", version=i, before={"eu": 1.0}, after={"eu": 0.5, "us": 0.5},
                             reason=f"step {i}", mode="live", result="applied", time=T0 + i)


class _Future:
    def __init__(self) -> None:
        self._ok: list[Callable[[Any], None]] = []
        self._err: list[Callable[[BaseException], None]] = []

    def add_callback(self, fn: Callable[[Any], None]) -> None:
        self._ok.append(fn)

    def add_errback(self, fn: Callable[[BaseException], None]) -> None:
        self._err.append(fn)


class FakeProducer:
    """Acknowledges on flush(), in send order; ``fail_ids`` are not acknowledged; ``gate`` holds send()."""

    def __init__(self, raises: int = 0, gate: threading.Event | None = None, fail_ids: set[str] = frozenset()):
        self.raises = raises
        self.gate = gate
        self.fail_ids = set(fail_ids)
        self.sent: list[AuditRecord] = []
        self.pending: list[tuple[AuditRecord, _Future]] = []
        self.closed = False
        self.lock = threading.Lock()

    def send(self, topic: str, key: bytes, value: bytes) -> _Future:
        if self.gate is not None:
            self.gate.wait()
        if self.raises:
            self.raises -= 1
            raise KafkaTimeoutError("Failed to update metadata after 5.0 secs.")
        fut = _Future()
        with self.lock:
            self.pending.append((AuditRecord.decode(value), fut))
        return fut

    def flush(self, timeout: float | None = None) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for rec, fut in pending:
            if rec.id in self.fail_ids:
                for fn in fut._err:
                    fn(KafkaTimeoutError("Batch expired"))
            else:
                self.sent.append(rec)
                for fn in fut._ok:
                    fn(None)

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


class Factory:
    """Raises KafkaConnectionError ``away`` times (a broker not up yet), then builds ``producer``."""

    def __init__(self, producer: FakeProducer, away: int = 0, gate: threading.Event | None = None) -> None:
        self.producer = producer
        self.away = away
        self.gate = gate
        self.calls = 0

    def __call__(self) -> FakeProducer:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait()
        if self.away:
            self.away -= 1
            raise KafkaConnectionError("Unable to bootstrap from 127.0.0.1:9")
        return self.producer


def _count(name: str, topic: str) -> float:
    return REGISTRY.get_sample_value(name, {"topic": topic}) or 0.0


def _returns(fn: Callable[[], Any]) -> Any:
    """Run fn on another thread; fail (instead of hanging the suite) if it does not return."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(GUARD_S)
    assert not t.is_alive(), "the call waited for the broker"
    return out[0] if out else None


def test_a_broker_away_at_start_neither_blocks_nor_fails_the_caller_and_nothing_is_lost() -> None:
    gate = threading.Event()                       # the producer cannot be built until the broker is up
    producer = FakeProducer()
    factory = Factory(producer, away=2, gate=gate)
    topic = unique("audit")
    pub = _returns(lambda: KafkaAuditPublisher("127.0.0.1:9", topic=topic, producer_factory=factory,
                                               retry_max_s=0.05))
    audit = AuditLog([pub])
    recs = _returns(lambda: [audit.record(**_fields(i)) for i in range(5)])
    assert pub.queued == 5 and producer.sent == []
    gate.set()
    assert pub.flush(GUARD_S)
    assert [r.id for r in producer.sent] == [r.id for r in recs]       # in order, none lost
    assert factory.calls == 3 and _count("opsloop_audit_published_total", topic) == 5
    pub.close(1)
    assert producer.closed


def _fields(i: int) -> dict[str, Any]:
    return dict(actor="controller.edge", action="edge.weights.push", target="haproxy:ams/app", edge="ams",
                version=i, before={"eu": 1.0}, after={"eu": 0.5, "us": 0.5}, reason=f"step {i}", mode="live",
                result="applied", time=T0 + i)


def test_a_blocking_send_does_not_block_submit() -> None:
    gate = threading.Event()                       # send() waits, as kafka-python's does for metadata
    producer = FakeProducer(gate=gate)
    pub = KafkaAuditPublisher("127.0.0.1:9", topic=unique("audit"), producer_factory=lambda: producer)
    _returns(lambda: [pub.submit(_rec(i)) for i in range(50)])
    gate.set()
    assert pub.flush(GUARD_S)
    assert [r.version for r in producer.sent] == list(range(50))
    pub.close(1)


def test_a_send_that_raises_is_retried_in_order_not_counted_failed() -> None:
    producer = FakeProducer(raises=3)
    topic = unique("audit")
    pub = KafkaAuditPublisher("127.0.0.1:9", topic=topic, producer_factory=lambda: producer, retry_max_s=0.05)
    for i in range(4):
        pub.submit(_rec(i))
    assert pub.flush(GUARD_S)
    assert [r.version for r in producer.sent] == [0, 1, 2, 3]
    assert _count("opsloop_audit_publish_failures_total", topic) == 0
    pub.close(1)


def test_a_record_kafka_does_not_acknowledge_is_counted_and_the_rest_go_on() -> None:
    bad = _rec(1)
    producer = FakeProducer(fail_ids={bad.id})
    topic = unique("audit")
    pub = KafkaAuditPublisher("127.0.0.1:9", topic=topic, producer_factory=lambda: producer)
    for r in (_rec(0), bad, _rec(2)):
        pub.submit(r)
    assert pub.flush(GUARD_S)
    assert [r.version for r in producer.sent] == [0, 2]
    assert _count("opsloop_audit_publish_failures_total", topic) == 1
    assert _count("opsloop_audit_published_total", topic) == 2
    pub.close(1)


def test_a_long_outage_keeps_the_newest_records_and_counts_the_dropped() -> None:
    gate = threading.Event()
    producer = FakeProducer()
    topic = unique("audit")
    pub = KafkaAuditPublisher("127.0.0.1:9", topic=topic, producer_factory=Factory(producer, gate=gate),
                              max_queued=10)
    for i in range(25):
        pub.submit(_rec(i))
    assert pub.queued == 10
    assert _count("opsloop_audit_publish_dropped_total", topic) == 15
    assert _count("opsloop_audit_publish_queued_records", topic) == 10
    gate.set()
    assert pub.flush(GUARD_S)
    assert [r.version for r in producer.sent] == list(range(15, 25))
    pub.close(1)


def test_close_during_an_outage_returns_and_counts_what_was_never_sent() -> None:
    gate = threading.Event()                       # never set: the broker stays away
    topic = unique("audit")
    pub = KafkaAuditPublisher("127.0.0.1:9", topic=topic, producer_factory=Factory(FakeProducer(), gate=gate))
    for i in range(3):
        pub.submit(_rec(i))
    assert pub.flush(0.2) is False
    _returns(lambda: pub.close(0.2))
    assert _count("opsloop_audit_publish_dropped_total", topic) == 3
    pub.submit(_rec(9))                            # after close: counted, never raised
    assert _count("opsloop_audit_publish_dropped_total", topic) == 4
    gate.set()


def test_the_real_client_against_a_dead_port_does_not_block_the_caller() -> None:
    # kafka-python's own KafkaProducer, no broker on the port: built on the sender thread, retried
    topic = unique("audit")
    pub = _returns(lambda: KafkaAuditPublisher(f"127.0.0.1:{free_port()}", topic=topic))
    _returns(lambda: pub.submit(_rec(0)))
    assert pub.queued == 1
    _returns(lambda: pub.close(0.5))
    assert _count("opsloop_audit_publish_dropped_total", topic) == 1
