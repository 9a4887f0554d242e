"""The Faust agent of the edge demand aggregator: ``telemetry.lb`` → :class:`DemandAggregator` → ``edge.demand``.

It reads the same topic as the ``lb-rates`` agent, which already dead-letters and counts bad
records; this agent decodes the batch the same way (:func:`decode_messages`) but only uses the
good samples, so nothing is dead-lettered or counted twice. The records the handler leaves in its
outbox are sent keyed ``backend|edge``.
"""

from __future__ import annotations

import time

import faust
from prometheus_client import Counter

from opsloop.config import Settings
from opsloop.log import get_logger
from opsloop.wire import Topic
from streams.edge.demand import DemandAggregator
from streams.runtime.app import raw_topic
from streams.runtime.batch import decode_messages

log = get_logger("stream.edge_demand")
AGENT_NAME = "edge-demand"

PUBLISHED = Counter("opsloop_edge_demand_records_total", "Demand records sent to edge.demand")
FAILURES = Counter("opsloop_edge_demand_errors_total", "Demand batches or sends that failed", ["stage"])


def register_edge_demand(app: faust.App, settings: Settings) -> DemandAggregator:
    handler = DemandAggregator(ttl_s=settings.stream.series_ttl_s)
    source = raw_topic(app, Topic.LB)
    sink = raw_topic(app, Topic.EDGE_DEMAND)
    size, within = settings.stream.batch_size, settings.stream.batch_within_s

    async def agent(stream: faust.StreamT) -> None:
        async for events in stream.take_events(size, within=within):
            batch = decode_messages([e.message for e in events])
            if not batch.metrics:
                continue
            try:
                handler.handle(batch.metrics, time.time())
            except Exception as e:  # noqa: BLE001 - a handler bug must not stop the worker
                FAILURES.labels("handle").inc()
                log.error("demand_handler_failed", error=f"{type(e).__name__}: {e}", exc_info=True)
                handler.drain()
                continue
            for rec in handler.drain():
                try:
                    await sink.send(key=rec.key.encode(), value=rec.encode())
                    PUBLISHED.inc()
                except Exception as e:  # noqa: BLE001 - a send failure must not stop the agent
                    FAILURES.labels("send").inc()
                    log.error("demand_send_failed", key=rec.key, error=f"{type(e).__name__}: {e}")

    app.agent(source, name=AGENT_NAME)(agent)
    return handler
