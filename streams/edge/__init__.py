"""Edge demand: per-edge, per-listener request rates from load-balancer telemetry → ``edge.demand``."""

from opsloop.streams.edge.demand import DemandAggregator, EdgeDemand, OriginState

__all__ = ["DemandAggregator", "EdgeDemand", "OriginState"]
