"""A demand record the broker refuses after the send returned (it returns once the record is buffered) is counted in
``opsloop_edge_demand_errors_total{stage="delivery"}`` and logged ``demand_delivery_failed``.

Before, only a send that raised was counted: a refusal later (the record over ``edge.demand``'s
``max.message.bytes``: a backend of many servers; a timeout) left Faust's ``_on_published error`` warning alone, the
batch's offsets were committed and the controller's demand went stale with nothing in the stream stage saying why.
The live test runs a real worker whose ``edge.demand`` topic takes records of at most 1024 bytes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

from opsloop.config import Settings
from opsloop.log import Sampled
from opsloop.records import metric
from opsloop.streams.edge import agent as edge_agent
from opsloop.streams.lb.rates import LbRates
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.alerting import ensure_topics
from tests.e2e.pipeline import pipeline_config, start_worker
from tests.helpers import captured_logs, create_topics, read_topic, scrape_metric, unique, wait_until, write_config

T0 = 1_795_000_000.0


def _delivery_failures() -> float:
    return edge_agent.FAILURES.labels("delivery")._value.get()


class Sink:
    """Faust's topic as the stage sees it: ``send`` returns the delivery's future once the record is buffered."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, asyncio.Future[Any]]] = []

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[Any]:
        self.deliveries.append((key, asyncio.get_running_loop().create_future()))
        return self.deliveries[-1][1]


def _rows(backend: str, count: int, ts: float) -> list:
    return [metric("haproxy", {"hrsp_2xx": count, "status": "UP"},
                   {"host": "e1", "proxy": backend, "sv": "s1", "type": "server"}, ts)]


def test_a_delivery_refused_later_is_counted_and_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = Sink()
    monkeypatch.setattr(edge_agent, "raw_topic", lambda app, *topics: sink)
    monkeypatch.setattr(edge_agent, "DELIVERY_LOG", Sampled(60.0), raising=False)
    rates = LbRates()
    handler, send_outbox = edge_agent.edge_demand_stage(None, Settings(), rates)  # type: ignore[arg-type]

    async def scenario() -> float:
        for i in range(2):
            rows = _rows("be_a", 100 * i, T0 + 10 * i) + _rows("be_b", 100 * i, T0 + 10 * i) \
                + _rows("be_c", 100 * i, T0 + 10 * i)
            rates.handle(rows, T0 + 10 * i)
            handler.handle(rows, T0 + 10 * i)
            await send_outbox()
        before = _delivery_failures()
        assert [k for k, _ in sink.deliveries] == [b"be_a|e1", b"be_b|e1", b"be_c|e1"]
        sink.deliveries[0][1].set_exception(RuntimeError("MessageSizeTooLargeError: the broker refused it"))
        sink.deliveries[1][1].set_result("metadata")
        sink.deliveries[2][1].cancel()   # the producer stopped first
        await asyncio.sleep(0)   # the done callbacks were scheduled first: they run before this task resumes
        return _delivery_failures() - before

    with captured_logs() as logs:
        counted = asyncio.run(scenario())
    assert counted == 2
    [line] = [ln for ln in logs.lines if ln.startswith("demand_delivery_failed")]   # the first; both counted
    assert "MessageSizeTooLargeError" in line and "be_a|e1" in line


@pytest.mark.integration
def test_a_worker_counts_the_demand_record_the_broker_refuses(stack: Any, tmp_path: Path) -> None:
    config, doc = pipeline_config(tmp_path, stack)
    prefix = unique("demandfail") + "."
    doc["kafka"]["topic_prefix"] = prefix
    write_config(config, doc)
    lb, demand = f"{prefix}{Topic.LB.value}", f"{prefix}{Topic.EDGE_DEMAND.value}"
    create_topics(stack.kafka_bootstrap, demand, partitions=doc["kafka"]["partitions"], max_message_bytes=1024)
    ensure_topics(stack.kafka_bootstrap, lb)
    port = doc["stream"]["metrics_port"]
    worker = start_worker(tmp_path, config, doc, stack)

    def produce(backend: str, servers: int, count: int, ts: float) -> None:
        rows = [metric("haproxy", {"hrsp_2xx": count, "status": "UP"},
                       {"host": "edge-x", "proxy": backend, "sv": f"server-{i:03d}-" + "n" * 100, "type": "server"},
                       ts) for i in range(servers)]
        producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
        try:
            producer.send(lb, key=backend.encode(), value=encode_batch(rows))
            producer.flush()
        finally:
            producer.close()

    now = time.time()
    try:   # one backend at a time: in one producer batch the broker would refuse both
        produce("be_small", 1, 0, now - 20)
        produce("be_small", 1, 100, now - 10)
        written = wait_until(lambda: read_topic(stack.kafka_bootstrap, demand), timeout=90,
                             what="the small demand record written")
        produce("be_big", 12, 0, now - 20)   # 12 servers of 110-character names: about 2 KB
        produce("be_big", 12, 100, now - 10)
        wait_until(lambda: scrape_metric(port, "opsloop_edge_demand_errors_total", {"stage": "delivery"}),
                   timeout=60, what="the refused demand record counted")
        assert worker.running()
        assert scrape_metric(port, "opsloop_edge_demand_errors_total", {"stage": "delivery"}) == 1
    finally:
        worker.stop()
    assert [orjson.loads(r.value)["backend"] for r in written] == ["be_small"]
    assert [orjson.loads(r.value)["backend"] for r in read_topic(stack.kafka_bootstrap, demand)] == ["be_small"]
    assert "demand_delivery_failed" in worker.logfile.read_text()
