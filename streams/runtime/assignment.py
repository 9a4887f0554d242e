"""What this worker holds: its assigned partitions, and how many rebalances it has been through.

The group coordinator knows the whole group's assignment (``kafka-consumer-groups --describe``), but
the member ids it reports do not say which process is which. From the worker's own /metrics an
operator (and a test telling two workers apart) sees which partitions this process consumes now, and
whether a rebalance happened since the last look (a counter that moved).

Kafka's eager protocol (Faust's) revokes every partition before a rebalance and then hands each member
its whole new assignment: the gauge loses the revoked partitions at once and is rebuilt from the
assignment, so it never shows a partition this worker no longer holds.
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

import faust
from faust.types import TP
from prometheus_client import Counter, Gauge

from opsloop.log import get_logger

ASSIGNED = Gauge("opsloop_stream_partition_assigned",
                 "1 for each topic partition this worker's consumer holds (stream sources, and changelogs "
                 "of tables it serves or stands by for)", ["topic", "partition"])
REBALANCES = Counter("opsloop_stream_rebalances_total",
                     "Partition assignments this worker received: one per rebalance it took part in")

log = get_logger("stream")


def install_assignment_metrics(app: faust.App) -> None:
    """Follow ``app``'s assignment from its rebalance signals (every worker; before the app starts)."""

    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        for tp in revoked:
            ASSIGNED.remove(tp.topic, str(tp.partition))   # a no-op for a partition not shown

    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # Faust sends the whole new assignment after each rebalance: the gauge is rebuilt from it
        ASSIGNED.clear()
        for tp in assigned:
            ASSIGNED.labels(tp.topic, str(tp.partition)).set(1)
        REBALANCES.inc()
        log.info("partitions_assigned", partitions=len(assigned),
                 topics=dict(sorted(Tally(tp.topic for tp in assigned).items())))

    app.on_partitions_assigned.connect(on_assigned, weak=False)
    app.on_partitions_revoked.connect(on_revoked, weak=False)
