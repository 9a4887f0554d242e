"""The stream stage counts a dead letter it could not write (``opsloop_deadletter_send_failures_total{stage="stream"}``)
and logs ``deadletter_send_failed``: the topic's send raising, or the delivery's future (what Faust's
``Topic.send`` returns) failing or cancelled later. Before, a raise counted only the generic
``opsloop_stream_errors_total`` and a later failure nothing at all: the bad record was gone without a trace.
The live test runs a real worker against a dead-letter topic (of its own topic prefix) that takes records of at
most 1024 bytes (``max.message.bytes``): the broker refuses the dead letter of a 4 KB bad record, as it would a
real one over the topic's limit."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Sequence

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.deadletter_metrics import DEADLETTER_SEND_FAILURES
from opsloop.log import Sampled
from opsloop.records import Metric
from opsloop.streams.runtime import batch as batch_module
from opsloop.streams.runtime import health
from opsloop.streams.runtime.batch import DeadLetter, process_batch
from opsloop.topics import Topic
from tests.alerting import ensure_topics
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import (ConsumerMsg, captured_logs, create_topics, read_topic, scrape_metric, unique, wait_until,
                           write_config)

BAD = [ConsumerMsg("telemetry.lb", 3, 70 + i, b"k", b"{not json " + b"secret" * 10) for i in range(2)]


class Handler:
    name = "noop"

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        pass


@pytest.fixture(autouse=True)
def fresh_log_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first loss is logged, whatever another test logged for the same agent and topic before."""
    monkeypatch.setattr(batch_module, "DEADLETTER_LOST_LOG", Sampled(60.0), raising=False)


def failures() -> float:
    return DEADLETTER_SEND_FAILURES.labels("stream")._value.get()


def test_a_dead_letter_send_that_raises_is_counted_per_dead_letter() -> None:
    async def send(dl: DeadLetter) -> None:
        raise RuntimeError("KafkaTimeoutError: " + "metadata " * 100)

    before, errors = failures(), health.ERRORS.labels("lb")._value.get()
    with captured_logs() as logs:
        asyncio.run(process_batch("lb", BAD, Handler(), send))
    assert failures() == before + 2
    assert health.ERRORS.labels("lb")._value.get() == errors + 2   # as before
    # one line a minute per agent and source topic (a poison topic must not flood the log), counted each
    [line] = [ln for ln in logs.lines if ln.startswith("deadletter_send_failed")]
    assert "'source_topic': 'telemetry.lb'" in line and "secret" not in line and "'offset': 70" in line
    assert len(line.split("'error': '", 1)[1].rsplit("'", 1)[0]) == 300


def test_the_next_line_a_minute_later_names_how_many_were_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(batch_module, "DEADLETTER_LOST_LOG", Sampled(60.0, clock=lambda: now[0]), raising=False)

    async def send(dl: DeadLetter) -> None:
        raise RuntimeError("KafkaTimeoutError: metadata")

    before = failures()
    with captured_logs() as logs:
        asyncio.run(process_batch("lb", BAD * 20, Handler(), send))
        now[0] = 61.0
        asyncio.run(process_batch("lb", BAD[:1], Handler(), send))
    assert failures() == before + 41
    lines = [ln for ln in logs.lines if ln.startswith("deadletter_send_failed")]
    assert len(lines) == 2 and "unlogged_since" not in lines[0] and "'unlogged_since': 39" in lines[1]


def test_a_delivery_that_fails_later_is_counted_once_and_a_delivered_one_not() -> None:
    async def scenario() -> tuple[float, float]:
        deliveries: list[asyncio.Future[Any]] = []

        async def send(dl: DeadLetter) -> asyncio.Future[Any]:
            deliveries.append(asyncio.get_running_loop().create_future())
            return deliveries[-1]

        before = failures()
        await process_batch("lb", [*BAD, ConsumerMsg("telemetry.lb", 3, 72, b"k", b"[1]")], Handler(), send)
        assert failures() == before   # buffered, not refused yet
        deliveries[0].set_exception(RuntimeError("MessageSizeTooLargeError: the broker refused it"))
        deliveries[1].set_result("metadata")
        deliveries[2].cancel()   # the producer stopped first
        await asyncio.sleep(0)   # the done callbacks were scheduled first: they run before this task resumes
        return before, failures()

    with captured_logs() as logs:
        before, after = asyncio.run(scenario())
    assert after == before + 2
    [line] = [ln for ln in logs.lines if ln.startswith("deadletter_send_failed")]   # the first; both counted
    assert "MessageSizeTooLargeError" in line and "'offset': 70" in line


@pytest.mark.integration
def test_a_worker_counts_the_dead_letter_the_broker_refuses(stack: Any, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    prefix = unique("dlfail-stream") + "."
    doc["kafka"]["topic_prefix"] = prefix
    write_config(config, doc)
    lb, deadletter = f"{prefix}{Topic.LB.value}", f"{prefix}{Topic.DEADLETTER.value}"
    create_topics(stack.kafka_bootstrap, deadletter, partitions=doc["kafka"]["partitions"], max_message_bytes=1024)
    ensure_topics(stack.kafka_bootstrap, lb)
    port = doc["stream"]["metrics_port"]
    worker = start_worker(tmp_path, config, doc, stack)

    def produce(key: bytes, value: bytes) -> None:
        producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
        try:
            producer.send(lb, key=key, value=value)
            producer.flush()
        finally:
            producer.close()

    try:   # one after the other: in one producer batch the broker would refuse both
        produce(b"small", b"{not json")
        written = wait_until(lambda: read_topic(stack.kafka_bootstrap, deadletter), timeout=90,
                             what="the small dead letter written")
        produce(b"big", os.urandom(4096))   # not UTF-8: base64 in the dead letter, about 5.5 KB
        wait_until(lambda: scrape_metric(port, "opsloop_deadletter_send_failures_total", {"stage": "stream"}),
                   timeout=60, what="the refused dead letter counted")
        assert worker.running()
        assert scrape_metric(port, "opsloop_deadletter_send_failures_total", {"stage": "stream"}) == 1
    finally:
        worker.stop()
    assert [orjson.loads(r.value)["key"] for r in written] == ["small"]
    assert [orjson.loads(r.value)["key"] for r in read_topic(stack.kafka_bootstrap, deadletter)] == ["small"]
