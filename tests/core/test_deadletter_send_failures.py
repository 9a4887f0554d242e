"""A controller's dead letter that is never written is counted (``opsloop_deadletter_send_failures_total``, by
stage) and logged ``deadletter_failed``: whether kafka-python's ``send`` raises (a metadata timeout, a record over
``max_request_size``) or its future fails later (the broker refuses the record, the delivery times out, the
producer is closed first). Before, a raise was only logged and a later failure not even that: the refused record
was gone with no counter and no alert. ``send_deadletter`` never raises and never waits for the delivery.
The same against a real broker: tests/controllers/test_deadletter_send_failures.py."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from kafka.future import Future

from opsloop.config import KafkaSettings
from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop import kafka_clients
from opsloop.kafka_clients import send_deadletter
from opsloop.log import Sampled, get_logger
from tests.helpers import captured_logs

log = get_logger("test.deadletter")
SECRET = b"record-contents-never-logged"


@pytest.fixture(autouse=True)
def fresh_log_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first loss is logged, whatever another test logged for the same stage and topic before."""
    monkeypatch.setattr(kafka_clients, "DEADLETTER_LOST_LOG", Sampled(60.0), raising=False)


def failures(stage: str) -> float:
    return DEADLETTER_SEND_FAILURES.labels(stage)._value.get()


class Producer:
    """kafka-python's producer as ``send_deadletter`` uses it: ``send`` raises ``error`` or returns ``future``."""

    def __init__(self, error: Exception | None = None, future: Any = None) -> None:
        self.error, self.future, self.sent = error, future, 0

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"") -> Any:
        self.sent += 1
        if self.error is not None:
            raise self.error
        return self.future


def dead_letter(producer: Producer, stage: str) -> None:
    send_deadletter(producer, KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="t."), "not JSON",
                    source_topic="t.findings", partition=2, offset=41, key=b"k", value=SECRET, stage=stage,
                    log=log, value_is="record")


def test_a_send_that_raises_is_counted_and_logged_never_raised() -> None:
    before = failures("paging")
    with captured_logs() as logs:
        dead_letter(Producer(error=KafkaTimeoutError("Failed to update metadata after 5.0 secs. " + "x" * 500)),
                    "paging")
    assert failures("paging") == before + 1
    [line] = [ln for ln in logs.lines if ln.startswith("deadletter_failed")]
    assert "'stage': 'paging'" in line and "'source_topic': 't.findings'" in line and "'offset': 41" in line
    assert "KafkaTimeoutError: Failed to update metadata" in line and SECRET.decode() not in line
    error = line.split("'error': '", 1)[1].rsplit("'", 1)[0]
    assert len(error) == 300   # cut


def test_a_future_that_fails_later_is_counted_once_when_it_fails() -> None:
    future = Future()
    before = failures("actuator")
    with captured_logs() as logs:
        dead_letter(Producer(future=future), "actuator")
        assert failures("actuator") == before   # not sent yet: nothing lost
        future.failure(MessageSizeTooLargeError("The request included a message larger than the max message size"))
    assert failures("actuator") == before + 1
    [line] = [ln for ln in logs.lines if ln.startswith("deadletter_failed")]
    assert "MessageSizeTooLargeError" in line and "'stage': 'actuator'" in line and SECRET.decode() not in line


def test_a_future_failed_before_send_returned_is_counted_at_once() -> None:
    """kafka-python returns an already failed future for some errors (the topic's metadata unavailable)."""
    before = failures("edge-control")
    dead_letter(Producer(future=Future().failure(KafkaTimeoutError("metadata"))), "edge-control")
    assert failures("edge-control") == before + 1


def test_a_delivered_dead_letter_and_a_producer_without_futures_count_nothing() -> None:
    future = Future()
    before = failures("paging")
    with captured_logs() as logs:
        dead_letter(Producer(future=future), "paging")
        future.success("metadata")
        dead_letter(Producer(future=None), "paging")   # a stand-in producer (tests) returns nothing
    assert failures("paging") == before and not logs.lines


def test_a_flood_of_lost_dead_letters_is_counted_each_and_logged_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poison topic whose dead-letter topic refuses everything: every loss counted, one line a minute per stage
    and source topic naming how many were left out (before: one error line per record, a flood of the log)."""
    now = [0.0]
    monkeypatch.setattr(kafka_clients, "DEADLETTER_LOST_LOG", Sampled(60.0, clock=lambda: now[0]), raising=False)
    before = failures("paging")
    with captured_logs() as logs:
        for _ in range(100):
            dead_letter(Producer(future=Future().failure(MessageSizeTooLargeError("too large"))), "paging")
        now[0] = 30.0
        dead_letter(Producer(error=KafkaTimeoutError("metadata")), "actuator")   # another stage: its own line
        now[0] = 61.0
        dead_letter(Producer(future=Future().failure(MessageSizeTooLargeError("too large"))), "paging")
    assert failures("paging") == before + 101
    lines = [ln for ln in logs.lines if ln.startswith("deadletter_failed")]
    assert len(lines) == 3
    assert "'stage': 'paging'" in lines[0] and "unlogged_since" not in lines[0]
    assert "'stage': 'actuator'" in lines[1]
    assert "'stage': 'paging'" in lines[2] and "'unlogged_since': 99" in lines[2]
