"""Metrics more than one controller exports (each from its own process; one definition here so
that importing both, as tests and `make bench` do, registers each name once)."""

from __future__ import annotations

from prometheus_client import Gauge

# Set by the edge control service (stale telemetry: it holds its last weights) and by each weight
# actuator (stale or missing decisions: it holds the last applied weights). The alert rule takes max.
EDGE_FAIL_STATIC = Gauge("opsloop_edge_fail_static",
                         "1 while the last good weights are held (controller: stale telemetry; actuator: stale "
                         "or missing decisions)", ["listener", "edge"])
