"""Restart recovery against the real broker: ``recover_decisions`` reads ``edge.weights`` back from each
partition's end and keeps the newest decision per key, whatever the topic's length.

``edge.weights`` is not compacted: one record per ``listener|edge`` per tick, ~40k per key a week. Recovery
read it from the beginning under a 15 s deadline and, when the deadline came, returned what it had: the OLDEST
records (old versions, old weights to damp from), without a word. Here the deadline is a simulated clock that
each decoded record moves 10 us (~100k records/s, as measured), so which records a read reaches is exact.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import KafkaProducer

from opsloop.controllers.edge.service import app as app_module
from opsloop.controllers.edge.service import kafka_io
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.records import EdgeWeights
from opsloop.records.edge import LAST_EPOCH
from tests.controllers.edge.service.test_service import service_config
from tests.helpers import create_topics, unique

pytestmark = pytest.mark.integration

EPOCH = 1_795_400_000_000
DECODE_S = 1e-5   # simulated seconds per decoded record
KAFKA_LOG = "opsloop.controller.edge.kafka"


def weights(listener: str, edge: str, version: int, epoch: int = EPOCH) -> bytes:
    share = (version % 100) / 100   # each version its own weights: an old record shows in what is recovered
    return EdgeWeights(version=version, epoch=epoch, listener=listener, edge=edge,
                       weights={"near": share, "far": 1.0 - share}, computed_at=1_795_400_000.0 + version).encode()


def send_all(bootstrap: str, topic: str, records: list[tuple[int, str, bytes]]) -> None:
    """(partition, key, value) in this order."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    try:
        for partition, key, value in records:
            producer.send(topic, key=key.encode(), value=value, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()


class SimClock:
    """``kafka_io``'s ``time`` and ``EdgeWeights``: the clock moves as records are decoded (and 1 us a reading)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.decoded = 0

    def monotonic(self) -> float:
        self.now += 1e-6   # a read that stalls still comes to its deadline
        return self.now

    def decode(self, raw: Any) -> EdgeWeights:
        self.decoded += 1
        self.now += DECODE_S
        return EdgeWeights.decode(raw)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    sim = SimClock()
    monkeypatch.setattr(kafka_io, "time", SimpleNamespace(monotonic=sim.monotonic))
    monkeypatch.setattr(kafka_io, "EdgeWeights", SimpleNamespace(decode=sim.decode))
    return sim


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if getattr(r, "event", "") == name]


def long_history(listener: str, keys: int, versions: int) -> list[tuple[int, str, bytes]]:
    """``versions`` ticks of ``keys`` edges, one record per edge per tick, oldest first."""
    return [(0, f"{listener}|e{i:02d}", weights(listener, f"e{i:02d}", v))
            for v in range(1, versions + 1) for i in range(keys)]


def test_a_long_topic_gives_the_newest_decision_per_key_when_the_deadline_cuts_the_read(
        kafka_bootstrap: str, clock: SimClock, caplog: pytest.LogCaptureFixture) -> None:
    """20 edges x 300 ticks; a budget of ~1000 decoded records. Before: the first 1000-1500 records (versions
    up to ~75) came back as the decisions in force, and nothing was logged."""
    topic, listener = unique("weights-long"), unique("rec")
    create_topics(kafka_bootstrap, topic)
    send_all(kafka_bootstrap, topic, long_history(listener, 20, 300))
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1000 * DECODE_S)
    assert {k: r.version for k, r in out.items()} == {(listener, f"e{i:02d}"): 300 for i in range(20)}
    assert all(r.weights["near"] == 0.0 for r in out.values())   # version 300's own weights
    assert clock.decoded < 6000   # the deadline did cut the read: it is said so
    [cut] = events(caplog, "recover_incomplete")
    assert cut["cause"] == "deadline" and cut["keys_found"] == 20 and cut["records_read"] == clock.decoded
    [done] = events(caplog, "recover_done")
    assert done["complete"] is False and done["keys"] == 20


def test_the_read_stops_once_every_expected_key_has_its_newest(kafka_bootstrap: str, clock: SimClock,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    topic, listener = unique("weights-stop"), unique("rec")
    create_topics(kafka_bootstrap, topic)
    send_all(kafka_bootstrap, topic, long_history(listener, 20, 300))
    expected = [(listener, f"e{i:02d}") for i in range(20)]
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1000 * DECODE_S, expected=expected)
    assert {k: r.version for k, r in out.items()} == dict.fromkeys(expected, 300)
    assert clock.decoded == kafka_io.FIRST_CHUNK   # one chunk from the end, not the 6000 records
    assert events(caplog, "recover_incomplete") == []
    [done] = events(caplog, "recover_done")
    assert done["complete"] is True and done["records_read"] == kafka_io.FIRST_CHUNK and done["rejected"] == 0


def test_partitions_read_back_to_an_old_key_an_empty_partition_and_a_removed_listener(
        kafka_bootstrap: str, clock: SimClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Partition 0: edge a, 500 ticks, then one record of a listener since removed; partition 1: edge old's only
    record, then 700 ticks of edge b (found in the first chunk, old only at the beginning: chunks doubling from 16
    reach it); partition 2: nothing. The read goes on in every partition until old is found."""
    monkeypatch.setattr(kafka_io, "FIRST_CHUNK", 16)
    topic, listener, gone = unique("weights-parts"), unique("rec"), unique("gone")
    create_topics(kafka_bootstrap, topic, partitions=3)
    records = [(0, f"{listener}|a", weights(listener, "a", v)) for v in range(1, 501)]
    records.append((0, f"{gone}|x", weights(gone, "x", 9)))
    records.append((1, f"{listener}|old", weights(listener, "old", 4, epoch=EPOCH - 86_400_000)))
    records += [(1, f"{listener}|b", weights(listener, "b", v)) for v in range(1, 701)]
    send_all(kafka_bootstrap, topic, records)
    expected = [(listener, "a"), (listener, "b"), (listener, "old")]
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1.0, expected=expected)
    assert {k: (r.epoch, r.version) for k, r in out.items()} == {
        (listener, "a"): (EPOCH, 500), (listener, "b"): (EPOCH, 700), (listener, "old"): (EPOCH - 86_400_000, 4),
        (gone, "x"): (EPOCH, 9)}
    assert events(caplog, "recover_incomplete") == []
    [done] = events(caplog, "recover_done")
    assert done["complete"] is True and done["keys"] == 4 and done["records_read"] == len(records)


def test_every_partition_is_read_back_to_its_beginning(kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """No key expected: all of a topic of 3 x 12000 records, in chunks from 256 on, each record read once. Pausing
    the partitions done with a step (kafka-python 3.0) stalled such a read: polls came back empty with 2 of 3
    partitions unread, until the deadline. The real clock here (~3 s of reading): a stall is no decoded record."""
    topic, listener = unique("weights-all"), unique("rec")
    create_topics(kafka_bootstrap, topic, partitions=3)
    records = [(p, f"{listener}|p{p}e{i}", weights(listener, f"p{p}e{i}", v))
               for v in range(1, 401) for p in range(3) for i in range(30)]
    send_all(kafka_bootstrap, topic, records)
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=60.0)
    assert {k: r.version for k, r in out.items()} == {(listener, f"p{p}e{i}"): 400 for p in range(3) for i in range(30)}
    assert events(caplog, "recover_incomplete") == []
    [done] = events(caplog, "recover_done")
    assert done["complete"] is True and done["records_read"] == len(records)


def test_an_expected_key_not_on_the_topic_is_said_and_the_others_recovered(
        kafka_bootstrap: str, clock: SimClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An edge just added (no record yet): every partition is read to its beginning, and the warning names it."""
    monkeypatch.setattr(kafka_io, "FIRST_CHUNK", 16)
    topic, listener = unique("weights-absent"), unique("rec")
    create_topics(kafka_bootstrap, topic, partitions=2)
    send_all(kafka_bootstrap, topic, [(0, f"{listener}|a", weights(listener, "a", v)) for v in range(1, 101)])
    expected = [(listener, "a"), (listener, "new")]
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1.0, expected=expected)
    assert {k: r.version for k, r in out.items()} == {(listener, "a"): 100}
    [warning] = events(caplog, "recover_incomplete")
    assert warning["cause"] == "not_on_topic" and warning["keys_found"] == 1 and warning["keys_missing"] == 1
    assert warning["missing"] == [f"{listener}|new"] and warning["records_read"] == 100


def test_an_empty_topic_recovers_nothing_and_says_which_keys(kafka_bootstrap: str, clock: SimClock,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    topic, listener = unique("weights-empty"), unique("rec")
    create_topics(kafka_bootstrap, topic, partitions=2)
    expected = [(listener, f"e{i}") for i in range(8)]
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1.0, expected=expected)
    assert out == {}
    [warning] = events(caplog, "recover_incomplete")
    assert warning["keys_missing"] == 8 and len(warning["missing"]) == kafka_io.MISSING_SHOWN


def test_rejected_records_are_logged_once_per_kind_and_counted(kafka_bootstrap: str, clock: SimClock,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Before: one warning per unusable record, without bound (a topic of garbage: a flood at every start)."""
    topic, listener = unique("weights-bad"), unique("rec")
    create_topics(kafka_bootstrap, topic)
    key = f"{listener}|a"
    good = weights(listener, "a", 5)
    records = [(0, key, weights(listener, "a", 4)), (0, key, good)]
    records += [(0, key, b"{not json")] * 30
    records += [(0, key, weights(listener, "a", 6, epoch=LAST_EPOCH))] * 20   # valid, but no epoch left after it
    records += [(0, key, good.replace(b'"near":0.05', b'"near":-0.05'))] * 10
    records += [(0, key, b"")] * 3
    send_all(kafka_bootstrap, topic, records)
    with caplog.at_level(logging.INFO, logger=KAFKA_LOG):
        out = kafka_io.recover_decisions(kafka_bootstrap, topic=topic, timeout_s=1.0)
    assert out == {(listener, "a"): EdgeWeights.decode(good)}
    rejected = events(caplog, "recover_record_rejected")
    assert sorted(r["kind"] for r in rejected) == ["empty", "epoch", "not_json", "schema"]
    assert all(r["offset"] >= 2 and r["error"] for r in rejected)
    [done] = events(caplog, "recover_done")
    assert done["rejected"] == 63 and done["rejected_by_kind"] == {"not_json": 30, "epoch": 20, "schema": 10,
                                                                   "empty": 3}


def test_the_service_passes_its_topology_pairs(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``EdgeService.start`` tells recovery which keys it runs, so the read stops at their newest records."""
    listener, edge = unique("svc"), unique("lb")
    seen: list[Any] = []

    def spy(kafka: Any, **kw: Any) -> dict:
        seen.append(sorted(kw["expected"]))
        return {}

    monkeypatch.setattr(app_module, "recover_decisions", spy)
    svc = EdgeService(*service_config(kafka_bootstrap, listener, edge)).start()
    try:
        assert seen == [[(listener, edge)]]
    finally:
        svc.stop()
