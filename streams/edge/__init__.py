"""Edge demand: per-edge, per-listener request rates from load-balancer telemetry → ``edge.demand``."""

from opsloop.records import EdgeDemand, OriginState
from opsloop.streams.edge.demand import DemandAggregator

__all__ = ["DemandAggregator", "EdgeDemand", "OriginState"]
