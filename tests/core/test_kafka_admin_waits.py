"""``ensure_topics``' admin client waits no longer than its caller's ``timeout_s`` for a broker, and a creation that
could not be made for want of one is said to be deferred.

Before, ``KafkaAdminClient`` was built without ``bootstrap_timeout_ms``: kafka-python's default held it 30 s with no
broker answering, whatever ``timeout_s`` said (a collector's sender thread passes its ``send_timeout_s``; every
round behind it waited), and the warning did not say the creation was only put off.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
from kafka import KafkaAdminClient

from opsloop import kafka_admin
from opsloop.config import KafkaSettings
from opsloop.kafka_admin import ensure_configured_topics, ensure_topics
from opsloop.log import get_logger
from opsloop.stack import free_port
from opsloop.topics import Topic
from tests.helpers import unique

pytestmark = pytest.mark.integration


class Events(logging.Handler):
    """The ``opsloop`` loggers' events as (event, fields)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((getattr(record, "event", ""), dict(getattr(record, "fields", {}))))


@pytest.fixture
def events() -> Iterator[Events]:
    handler, logger = Events(), logging.getLogger("opsloop")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_the_admin_client_waits_for_a_broker_no_longer_than_timeout_s(kafka_bootstrap: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []

    class Recorded(KafkaAdminClient):   # the real client, against the real broker; its settings kept
        def __init__(self, **configs: Any) -> None:
            super().__init__(**configs)
            built.append(dict(self.config))

    monkeypatch.setattr(kafka_admin, "KafkaAdminClient", Recorded)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("adm") + ".")
    assert ensure_topics(kafka, 1, topics=[Topic.DEADLETTER.value], timeout_s=2.5) == [kafka.topic(Topic.DEADLETTER)]
    [config] = built
    # before: bootstrap_timeout_ms 30000 (kafka-python's default), whatever timeout_s said
    assert config["bootstrap_timeout_ms"] == 2500 and config["request_timeout_ms"] == 2500


def test_no_broker_answering_defers_the_creation_and_says_so(events: Events) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic_prefix=unique("adm") + ".")
    assert ensure_configured_topics(kafka, get_logger("test.admin"), [Topic.LB.value], timeout_s=1.0,
                                    collector="lb") is False
    [(_, fields)] = [(e, f) for e, f in events.events if e == "topics_not_created"]
    assert fields["topics"] == [kafka.topic(Topic.LB)] and fields["collector"] == "lb"
    assert fields["error"].startswith("KafkaTimeoutError")
    # before: the error alone, nothing saying the creation is only put off nor when it is tried again
    assert fields["deferred"] is True and fields["timeout_s"] == 1.0
    assert "creation deferred" in fields["consequence"] and "next producer" in fields["retried"]


def test_a_refused_creation_is_not_called_deferred(kafka_bootstrap: str, events: Events) -> None:
    # one broker cannot hold two replicas: refused, as a client without the right to create is
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique("adm") + ".", replication_factor=2)
    assert ensure_configured_topics(kafka, get_logger("test.admin"), [Topic.LB.value], retried="never") is False
    [(_, fields)] = [(e, f) for e, f in events.events if e == "topics_not_created"]
    assert fields["deferred"] is False and fields["retried"] == "never"
    assert "InvalidReplicationFactor" in fields["error"] and fields["consequence"].startswith("refused")
