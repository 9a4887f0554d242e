"""The controllers' dead letters (paging, weight actuators, edge control) through a real Kafka: a refused record
that carries the ``opsloop-replayed-from`` header (put there by ``opsloop deadletter replay``) is dead-lettered
with ``replayed_from``, so the CLI tells a replay refused again from a new failure and does not replay it again
unless forced; without the header ``replayed_from`` is absent. Every such dead letter keeps the whole record
(``value_is`` = ``record``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.audit.trail import AuditLog
from opsloop.config import KafkaSettings, Settings
from opsloop.deadletter_cli import NotReplayable, decode_letter, refuse_replayed
from opsloop.records import EdgeDemand, OriginState
from opsloop.records.deadletter import DEADLETTER_KEY_BYTES, REPLAYED_FROM_HEADER
from opsloop.topics import Topic
from opsloop.controllers.actuators.config import ActuatorConfig
from opsloop.controllers.actuators.service import ActuatorService
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.edge.service.config import EdgeServiceSettings
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.alerting import ensure_topics
from tests.controllers.actuators.support import ListSink, decision
from tests.helpers import SentRecords, read_topic, unique, wait_until

pytestmark = pytest.mark.integration

ORIGIN = "telemetry.deadletter/0/17"   # the dead letter a replayed record was sent from
REPLAYED = [(REPLAYED_FROM_HEADER, ORIGIN.encode())]


def letters(bootstrap: str, topic: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` dead letters of ``topic`` (a prefixed one: this test's alone), each checked readable by
    the CLI; waits until there are ``n``."""
    docs = wait_until(lambda: len(d := [decode_letter(r.value) for r in read_topic(bootstrap, topic)]) >= n and d,
                      timeout=60, what=f"{n} dead letters on {topic}")
    assert len(docs) == n, docs
    return docs


def assert_marked(doc: dict[str, Any]) -> None:
    assert doc["replayed_from"] == ORIGIN and doc["value_is"] == "record"
    with pytest.raises(NotReplayable, match="refused again after a replay"):
        refuse_replayed(doc)   # `opsloop deadletter replay` leaves it without --force


def assert_not_marked(doc: dict[str, Any]) -> None:
    assert doc.get("replayed_from") is None and doc["value_is"] == "record"
    refuse_replayed(doc)


def test_paging_dead_letter_says_the_refused_record_was_a_replay(tmp_path: Path, kafka_bootstrap: str) -> None:
    """Two records that are no finding, one a replay: both dead-lettered by the paging consumer's own poll, the
    replay's marked with the dead letter it came from."""
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("h6p") + ".")
    ensure_topics(kafka_bootstrap, kafka.topic("findings"))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        producer.send(kafka.topic("findings"), key=b"k-replayed", value=b"{not json", headers=REPLAYED)
        producer.send(kafka.topic("findings"), key=b"k-new", value=b"[1, 2]")
        producer.flush()
    finally:
        producer.close()
    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json"), kafka)
    svc._connect()
    try:
        wait_until(lambda: (svc.step(), svc._caught_up)[1], timeout=60, what="paging caught up")
        svc._producer.flush()
        docs = {d["key"]: d for d in letters(kafka_bootstrap, kafka.topic(Topic.DEADLETTER.value), 2)}
    finally:
        svc.close()
    assert all(d["stage"] == "paging" and d["source_topic"] == kafka.topic("findings") for d in docs.values())
    assert_marked(docs["k-replayed"])
    assert docs["k-replayed"]["value"] == "{not json"
    assert_not_marked(docs["k-new"])


def test_actuator_dead_letters_say_the_refused_record_was_a_replay(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The weight actuator's two dead letters: a record that is no decision (refused at decode) and a decision
    given up after its apply failed (kept with the record until then). Replays are marked, a new record not."""
    edge = unique("h6a")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=edge + ".")
    cfg = ActuatorConfig(store_dir=tmp_path, stale_after_s=3600, reconcile_interval_s=None, max_apply_attempts=1,
                         targets=[{"edge": edge, "listener": "l", "kind": "haproxy", "socket": str(tmp_path / "none"),
                                   "backend": "be", "servers": {"a": "a", "b": "b"}}])
    key = f"l|{edge}".encode()
    good = decision(1, {"a": 0.5, "b": 0.5}, edge=edge, listener="l").encode()
    ensure_topics(kafka_bootstrap, kafka.topic(cfg.topic))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:   # one partition (the key's): read in this order
        producer.send(kafka.topic(cfg.topic), key=key, value=b"{replayed junk", headers=REPLAYED)
        producer.send(kafka.topic(cfg.topic), key=key, value=b"{new junk")
        producer.send(kafka.topic(cfg.topic), key=key, value=good, headers=REPLAYED)
        producer.flush()
    finally:
        producer.close()
    svc = ActuatorService(cfg, kafka, [edge], AuditLog([ListSink()]))
    slot = svc.slots[("l", edge)]

    def apply_bug(d: Any) -> Any:
        raise RuntimeError("apply bug")

    slot.actuator.apply = apply_bug   # type: ignore[method-assign]
    svc.connect()
    try:
        wait_until(lambda: (svc.step(), slot.given_up is not None)[1], timeout=60, what="the decision given up")
        svc._producer.flush()
        docs = letters(kafka_bootstrap, kafka.topic(Topic.DEADLETTER.value), 3)
    finally:
        svc.close()
    by_value = {d["value"]: d for d in docs}
    assert all(d["stage"] == "actuator" and d["key"] == key.decode() for d in docs)
    assert_marked(by_value["{replayed junk"])
    assert_not_marked(by_value["{new junk"])
    given_up = by_value[good.decode()]
    assert given_up["reason"].startswith("gave up after 1 attempt(s)")
    assert_marked(given_up)


def test_edge_control_dead_letter_says_the_refused_record_was_a_replay(kafka_bootstrap: str) -> None:
    """edge.demand records that are no demand, one a replay, dead-lettered by the edge control service."""
    listener, edge = unique("h6e"), unique("lb")
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": kafka_bootstrap}})
    cfg = EdgeServiceSettings.model_validate({
        "interval_s": 1, "api": {"enabled": False}, "overrides_file": None,
        "topology": {"listeners": [{"name": listener, "backend": f"be-{listener}", "edges": [{"name": edge}],
                                    "origins": [{"name": "near", "capacity_rps": 40}],
                                    "latency_ms": {edge: {"near": 2}}}]}})
    key = f"be-{listener}|{edge}".encode()
    good = EdgeDemand(edge=edge, backend=f"be-{listener}", demand_rps=3.0, origins={"near": OriginState(rps=3.0)},
                      timestamp=time.time())
    svc = EdgeService(settings, cfg).start()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        assert svc.consumer is not None and svc.consumer.assigned.wait(30)
        producer.send(Topic.EDGE_DEMAND.value, key=key, value=b"{replayed junk", headers=REPLAYED)
        producer.send(Topic.EDGE_DEMAND.value, key=key, value=b"{new junk")
        producer.send(Topic.EDGE_DEMAND.value, key=key, value=good.encode())
        producer.flush()
        wait_until(lambda: svc.book.get(f"be-{listener}", edge) is not None, timeout=30, what="good demand read")
        docs = wait_until(lambda: len(d := [decode_letter(r.value) for r in
                                            read_topic(kafka_bootstrap, Topic.DEADLETTER.value) if r.key == key]) >= 2
                          and d, timeout=30, what="dead letters")
    finally:
        svc.stop()
        producer.close()
    by_value = {d["value"]: d for d in docs}
    assert len(docs) == 2 and all(d["stage"] == "edge-control" for d in docs)
    assert_marked(by_value["{replayed junk"])
    assert_not_marked(by_value["{new junk"])


def test_odd_headers_never_stop_a_dead_letter(tmp_path: Path) -> None:
    """Headers a client may hand over oddly (none, empty, a None value, another header only) still give a dead
    letter: replayed_from only for the header, present but empty still a replay."""
    sent: list[tuple[str, bytes | None, bytes]] = []

    class Producer:
        def send(self, topic: str, key: bytes | None = None, value: bytes = b"") -> None:
            sent.append((topic, key, value))

    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json"), "127.0.0.1:1", consumer=object(),
                        producer=Producer())
    cases: list[Any] = [None, [], [("other", b"x")], [(REPLAYED_FROM_HEADER, None)], [(REPLAYED_FROM_HEADER, b"")],
                        REPLAYED]
    svc.handle_records([b"nope"] * len(cases), 0.0, [(0, i, None) for i in range(len(cases))], cases)
    got = [orjson.loads(v).get("replayed_from") for _, _, v in sent]
    assert got == [None, None, None, "?", "?", ORIGIN]


def test_a_huge_key_is_cut_in_the_dead_letters_kafka_key_too(tmp_path: Path) -> None:
    """The body cuts the key to DEADLETTER_KEY_BYTES and says so; the message's own key was sent whole, and a key
    near 1 MB took the dead letter past Kafka's message limit: the producer refused it, the dead letter was lost."""
    sent = SentRecords()
    svc = PagingService(PagingConfig(state_file=tmp_path / "state.json"), "127.0.0.1:1", consumer=object(),
                        producer=sent)
    huge = b"k" * (900 * 1024)
    svc.handle_records([b"nope"], 0.0, [(0, 7, huge)])
    [(topic, key, value)] = sent.records
    doc = orjson.loads(value)
    assert topic == "telemetry.deadletter" and key == huge[:DEADLETTER_KEY_BYTES]
    assert doc["key_truncated"] is True and doc["key_bytes"] == len(huge)
