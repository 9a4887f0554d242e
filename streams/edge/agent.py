"""The edge demand stage of the ``lb`` agent: ``telemetry.lb`` → :class:`DemandAggregator` → ``edge.demand``.

It runs in the same agent as ``lb-rates`` (after it, on the same decoded batch, reading the rates
that handler computed), so a record is fetched, decoded and dead-lettered once. After each batch
the records the aggregator left in its outbox are sent keyed ``backend|edge``. A send returns once the record is
buffered: one the broker refuses later (over the topic's ``max.message.bytes``, a timeout) or the producer drops
at stop is counted in ``opsloop_edge_demand_errors_total{stage="delivery"}`` and logged ``demand_delivery_failed``
(before, only Faust's ``_on_published error`` warning said it, and the batch's offsets were committed).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import faust
from prometheus_client import Counter

from opsloop.config import Settings
from opsloop.log import Sampled, get_logger
from opsloop.topics import Topic
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.app import AfterBatch, raw_topic

log = get_logger("stream.edge_demand")

PUBLISHED = Counter("opsloop_edge_demand_records_total", "Demand records sent to edge.demand")
FAILURES = Counter("opsloop_edge_demand_errors_total", "Demand records that could not be sent", ["stage"])
# a topic refusing every record fails each edge's every round: one line a minute (the counter carries the rate)
DELIVERY_LOG = Sampled(60.0)


def _delivered(key: str, delivery: asyncio.Future[Any]) -> None:
    """A demand record's delivery ended: lost if it failed or was cancelled (the producer stopped first)."""
    if delivery.cancelled():
        error = "CancelledError: delivery cancelled (the producer stopped first)"
    elif (e := delivery.exception()) is not None:   # also marks it retrieved: no asyncio warning at GC
        error = f"{type(e).__name__}: {e}"
    else:
        return
    FAILURES.labels("delivery").inc()
    DELIVERY_LOG.error(log, "demand_delivery_failed", key="delivery", record_key=key[:300], error=error[:300])


def edge_demand_stage(app: faust.App, settings: Settings, rates: LbRates) -> tuple[DemandAggregator, AfterBatch]:
    """The demand handler (to run right after ``rates`` on each batch) and the hook that sends its outbox."""
    handler = DemandAggregator(ttl_s=settings.stream.series_ttl_s, rates=rates)
    sink = raw_topic(app, Topic.EDGE_DEMAND)

    async def send_outbox() -> None:
        # Drained even when the handler failed part-way: a partial outbox is still correct per record.
        for rec in handler.drain():
            try:
                sent = await sink.send(key=rec.key.encode(), value=rec.encode())
                PUBLISHED.inc()
            except Exception as e:  # noqa: BLE001 - a send failure must not stop the agent
                FAILURES.labels("send").inc()
                log.error("demand_send_failed", key=rec.key, error=f"{type(e).__name__}: {e}")
                continue
            if isinstance(sent, asyncio.Future):   # buffered: the broker's refusal comes later, on this
                sent.add_done_callback(partial(_delivered, rec.key))

    return handler, send_outbox
