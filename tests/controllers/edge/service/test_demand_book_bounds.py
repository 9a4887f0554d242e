"""The edge controller's demand book: what it drops is counted, and keys the topology does not read are bounded.

Before (old code): a record older than the one kept was dropped without a count (a replay, or an LB's clock
stepping back, left no trace), and every distinct (backend, edge) key was kept for ``ttl_s`` (an hour) however
many came: a flood of bogus edge names on ``edge.demand`` grew the service's memory without bound.
Now: ``opsloop_edge_demand_dropped_total{reason="superseded"}`` counts the former; past ``max_unknown_keys`` keys
the topology does not read, the least recently updated goes (``{reason="unknown_cap"}``); the topology's keys are
never evicted so, however old their last record.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer
from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.edge.service.config import EdgeServiceSettings
from opsloop.controllers.edge.service.inputs import DemandBook, DemandConsumer
from opsloop.records import EdgeDemand, OriginState
from tests.helpers import create_topics, unique, wait_until

T0 = 1_700_000_000.0


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("opsloop_edge_demand_dropped_total", {"reason": reason}) or 0.0


def rec(backend: str, edge: str, ts: float, rps: float = 10.0) -> EdgeDemand:
    return EdgeDemand(edge=edge, backend=backend, demand_rps=rps, origins={"near": OriginState(rps=rps)},
                      timestamp=ts)


def test_a_record_older_than_the_one_kept_is_counted_and_changes_nothing() -> None:
    book = DemandBook(clock=lambda: T0)
    before = dropped("superseded")
    assert book.update(rec("be", "ams", T0 - 1, rps=2.0))
    assert book.update(rec("be", "ams", T0 - 5, rps=3.0))        # older: a replay, or out of order
    assert book.update(rec("be", "ams", T0 - 1, rps=4.0))        # the same time: an at-least-once repeat, taken
    assert book.get("be", "ams").demand_rps == 4.0
    assert dropped("superseded") == before + 1


def test_unknown_keys_are_bounded_and_the_known_ones_are_never_evicted() -> None:
    clock = [T0]
    book = DemandBook(clock=lambda: clock[0], known=[("be", "ams"), ("be", "fra")], max_unknown_keys=10)
    before = dropped("unknown_cap")
    book.update(rec("be", "ams", T0))      # the known keys' records are the oldest of the book
    book.update(rec("be", "fra", T0))
    for i in range(50):                    # a flood of distinct bogus edge names, each newer than the known
        clock[0] += 1
        book.update(rec("be", f"bogus-{i}", clock[0]))
    assert len(book) == 2 + 10
    assert dropped("unknown_cap") == before + 40
    assert book.get("be", "ams") is not None and book.get("be", "fra") is not None
    assert book.get("be", "bogus-39") is None and book.get("be", "bogus-40") is not None   # least recent went
    # an unknown key updated again is the most recent: the next one evicts another
    book.update(rec("be", "bogus-40", clock[0] + 1))
    book.update(rec("be", "bogus-new", clock[0] + 1))
    assert book.get("be", "bogus-40") is not None and book.get("be", "bogus-41") is None
    # the known keys keep their updates, and the TTL still applies to everyone (counted by its own reason)
    ttl_before = dropped("ttl")
    clock[0] += 3 * 3600
    book.update(rec("be", "ams", clock[0], rps=7.0))
    assert book.get("be", "ams").demand_rps == 7.0 and book.get("be", "fra") is None
    assert len(book) == 1 and dropped("ttl") == ttl_before + 11


def test_the_service_reads_its_known_keys_from_the_topology() -> None:
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"}})
    cfg = EdgeServiceSettings.model_validate({
        "api": {"enabled": False}, "overrides_file": None,
        "topology": {"listeners": [
            {"name": "web", "backend": "be_web", "edges": [{"name": "ams", "lb": "ams-haproxy-1"}, {"name": "fra"}],
             "origins": [{"name": "near", "capacity_rps": 40}], "latency_ms": {"ams": {"near": 2}, "fra": {"near": 3}}},
            {"name": "api", "edges": [{"name": "ams", "lb": "ams-haproxy-1"}],
             "origins": [{"name": "near", "capacity_rps": 40}], "latency_ms": {"ams": {"near": 2}}}]}})
    svc = EdgeService(settings, cfg)
    try:
        assert svc.book.known == {("be_web", "ams-haproxy-1"), ("be_web", "fra"), ("api", "ams-haproxy-1")}
    finally:
        svc.stop()


@pytest.mark.integration
def test_a_flood_of_bogus_keys_on_the_topic_stays_bounded(kafka_bootstrap: str) -> None:
    topic, backend = unique("edge.demand-flood"), unique("be")
    create_topics(kafka_bootstrap, topic)
    book = DemandBook(known=[(backend, "lb-real")], max_unknown_keys=20)
    consumer = DemandConsumer(kafka_bootstrap, book, topic=topic).start()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    before = dropped("unknown_cap")
    try:
        assert consumer.assigned.wait(30)
        real = rec(backend, "lb-real", time.time())
        producer.send(topic, key=real.key.encode(), value=real.encode())
        for i in range(300):
            r = rec(backend, f"lb-bogus-{i}", time.time())
            producer.send(topic, key=r.key.encode(), value=r.encode())
        producer.flush()
        wait_until(lambda: book.received == 301, timeout=60, what="the flood read")
        assert len(book) == 21 and dropped("unknown_cap") == before + 280
        assert book.get(backend, "lb-real") is not None
    finally:
        consumer.stop()
        producer.close()
