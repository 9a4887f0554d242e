"""``controllers.edge.max_epoch_ahead_s``: how far ahead of this host's clock a recovered epoch may be and still be
continued from. It was not configurable: with the actuators' ``max_clock_skew_s`` raised (up to 3600 s), an epoch
they took from a controller whose clock ran ahead was skipped by its restarted successor, whose own epoch (its start
time) then stayed below it: every decision refused as older, for good."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer

from opsloop.config import Settings, validation_errors
from opsloop.controllers.edge.service.app import EdgeService
from opsloop.controllers.edge.service.config import EdgeServiceSettings
from opsloop.records import EdgeWeights
from opsloop.topics import Topic
from tests.controllers.edge.service.test_config import EXAMPLE
from tests.helpers import create_topics, unique

AHEAD_S = 60.0   # the previous controller's clock ran this far ahead (the actuators allow it: max_clock_skew_s 120)


def _service(bootstrap: str, prefix: str, listener: str, edge: str, **extra: object) -> EdgeService:
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": bootstrap, "topic_prefix": prefix}})
    cfg = EdgeServiceSettings.model_validate({
        "interval_s": 1, "api": {"enabled": False}, "controller": {"stale_after_s": 3}, "overrides_file": None,
        "topology": {"listeners": [{
            "name": listener, "backend": f"be-{listener}", "edges": [{"name": edge}],
            "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 1000}],
            "latency_ms": {edge: {"near": 2, "far": 30}}}]}, **extra})
    return EdgeService(settings, cfg).start()


@pytest.mark.integration
def test_the_setting_reaches_recovery(kafka_bootstrap: str) -> None:
    prefix, listener, edge = unique("epochahead") + ".", unique("lst"), unique("lb")
    topic = prefix + Topic.EDGE_WEIGHTS.value
    create_topics(kafka_bootstrap, topic)
    ahead = int((time.time() + AHEAD_S) * 1000)
    rec = EdgeWeights(version=41, epoch=ahead, listener=listener, edge=edge, weights={"near": 0.3, "far": 0.7},
                      computed_at=time.time())
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        producer.send(topic, key=f"{listener}|{edge}".encode(), value=rec.encode())
        producer.flush(timeout=30)
    finally:
        producer.close()

    tolerant = _service(kafka_bootstrap, prefix, listener, edge, max_epoch_ahead_s=2 * AHEAD_S)
    try:
        assert tolerant.loop is not None
        assert tolerant.loop.epoch == ahead + 1   # chased: its decisions win over the record the actuators took
        assert tolerant.loop.listeners[listener].controller.version == 41
    finally:
        tolerant.stop()
    # the default (10 s) skips it: the controller's own epoch is its clock (that the setting is what decides)
    default = _service(kafka_bootstrap, prefix, listener, edge)
    try:
        assert default.loop is not None
        assert default.loop.epoch < ahead and default.loop.listeners[listener].controller.version == 0
    finally:
        default.stop()


def test_the_actuators_skew_must_stay_below_it() -> None:
    edge = {"topology_file": str(EXAMPLE), "interval_s": 5, "controller": {"stale_after_s": 30}}
    # defaults: 5 s of actuator skew, 10 s tolerated
    assert validation_errors({"controllers": {"edge": edge, "actuator": {}}}) == []
    errors = validation_errors({"controllers": {"edge": edge, "actuator": {"max_clock_skew_s": 60}}})
    assert errors == ["controllers.edge.max_epoch_ahead_s (10) must be above controllers.actuator.max_clock_skew_s "
                      "(60; twice it is the safe margin): a restarted controller would not continue from an epoch "
                      "the actuators took, and they would refuse every decision it makes"]
    assert validation_errors({"controllers": {"edge": {**edge, "max_epoch_ahead_s": 120},
                                              "actuator": {"max_clock_skew_s": 60}}}) == []
    assert validation_errors({"controllers": {"edge": {**edge, "max_epoch_ahead_s": 0}}})   # refused: gt 0
