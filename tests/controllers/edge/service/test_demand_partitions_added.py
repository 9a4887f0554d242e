"""Partitions added to ``edge.demand`` while the edge control service runs (real Kafka, real demand consumer).

An operator raises the partition count of a topic with ``kafka-topics --alter --partitions`` (the pipeline
runbook does so for the detector topics). The stream worker's producer then hashes the ``backend|edge`` keys over
the new count, so some edges' demand moves to a partition that did not exist when the service started.

Before (old code): the demand consumer assigned the partitions it found at start and never looked again. The
records of a moved edge were never read: its newest demand aged, the whole listener held its weights (fail
static) until a restart, while the status showed a consumer reading its other partitions as usual.
Now: the consumer sees the new partitions at its next metadata refresh and reads each from its beginning (the
records the producer put there before the refresh are read too; the book keeps the newest per key), logged
``demand_partitions_added``.
"""

from __future__ import annotations

import logging
import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewPartitions

from opsloop.controllers.edge.service.inputs import DemandBook, DemandConsumer
from opsloop.records import EdgeDemand, OriginState
from tests.helpers import create_topics, unique, wait_until

pytestmark = pytest.mark.integration


def demand(backend: str, edge: str, rps: float) -> EdgeDemand:
    return EdgeDemand(edge=edge, backend=backend, demand_rps=rps, origins={"near": OriginState(rps=rps)},
                      timestamp=time.time())


def test_demand_on_partitions_added_while_running_is_read(kafka_bootstrap: str, caplog) -> None:
    caplog.set_level(logging.INFO)
    topic, backend = unique("edge.demand-grown"), unique("be")
    create_topics(kafka_bootstrap, topic, partitions=1)
    book = DemandBook()
    consumer = DemandConsumer(kafka_bootstrap, book, topic=topic, metadata_max_age_ms=1000).start()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    try:
        assert consumer.assigned.wait(30)
        rec = demand(backend, "lb-0", 10.0)
        producer.send(topic, key=rec.key.encode(), value=rec.encode(), partition=0)
        producer.flush()
        wait_until(lambda: book.get(backend, "lb-0") is not None, timeout=30, what="demand on partition 0")

        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            admin.create_partitions({topic: NewPartitions(total_count=3)})
        finally:
            admin.close()
        grown = KafkaProducer(bootstrap_servers=kafka_bootstrap)   # a producer that knows the new count
        try:
            wait_until(lambda: grown.partitions_for(topic) == {0, 1, 2}, timeout=30, what="the producer sees 3")
            # sent at once: before the consumer's refresh, so read only if a new partition is read from its start
            for p in (1, 2):
                rec = demand(backend, f"lb-{p}", 20.0 + p)
                grown.send(topic, key=rec.key.encode(), value=rec.encode(), partition=p)
            grown.flush()
        finally:
            grown.close()
        for p in (1, 2):
            got = wait_until(lambda p=p: book.get(backend, f"lb-{p}"), timeout=60,
                             what=f"demand on the added partition {p}")
            assert got.demand_rps == 20.0 + p
        # the old partition is still read from where it was, not again from its start
        rec = demand(backend, "lb-0", 11.0)
        producer.send(topic, key=rec.key.encode(), value=rec.encode(), partition=0)
        producer.flush()
        wait_until(lambda: book.get(backend, "lb-0").demand_rps == 11.0, timeout=30, what="partition 0 still read")
        assert book.received == 4
        added = [r.msg for r in caplog.records if "demand_partitions_added" in r.getMessage()]
        assert added, "the added partitions are logged"
    finally:
        consumer.stop()
        producer.close()
