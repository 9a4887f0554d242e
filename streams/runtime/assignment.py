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


class AssignmentMetrics:
    """Keeps :data:`ASSIGNED` equal to the consumer's assignment; counts :data:`REBALANCES`."""

    def __init__(self) -> None:
        self.held: set[tuple[str, int]] = set()

    def revoked(self, partitions: set[TP]) -> None:
        for tp in partitions:
            if (tp.topic, tp.partition) in self.held:
                self.held.discard((tp.topic, tp.partition))
                ASSIGNED.remove(tp.topic, str(tp.partition))

    def assigned(self, partitions: set[TP]) -> None:
        now = {(tp.topic, tp.partition) for tp in partitions}
        for topic, partition in self.held - now:
            ASSIGNED.remove(topic, str(partition))
        for topic, partition in now - self.held:
            ASSIGNED.labels(topic, str(partition)).set(1)
        self.held = now
        REBALANCES.inc()
        log.info("partitions_assigned", partitions=len(now),
                 topics=dict(sorted(Tally(topic for topic, _ in now).items())))


def install_assignment_metrics(app: faust.App) -> AssignmentMetrics:
    """Follow ``app``'s assignment from its rebalance signals (every worker; before the app starts)."""
    metrics = AssignmentMetrics()

    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        metrics.assigned(assigned)   # Faust sends the whole new assignment after each rebalance

    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        metrics.revoked(revoked)

    app.on_partitions_assigned.connect(on_assigned, weak=False)
    app.on_partitions_revoked.connect(on_revoked, weak=False)
    return metrics
