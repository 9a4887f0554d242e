"""Prometheus metrics of the weight actuators (default registry, served by ``serve_metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from controllers.metrics import EDGE_FAIL_STATIC

APPLIES = Counter("opsloop_actuator_applies_total", "Decisions handled by result",
                  ["edge", "listener", "result"])
ERRORS = Counter("opsloop_actuator_errors_total", "Actuator errors (unreachable target, command, mismatch, ...)",
                 ["edge", "kind"])
SHADOW_DIFF = Gauge("opsloop_actuator_shadow_diff",
                    "Shadow mode: fraction of traffic the decision would move vs the live weights (0..1)",
                    ["edge", "listener"])
FAIL_STATIC = EDGE_FAIL_STATIC  # shared definition: controllers/metrics.py
WEIGHT = Gauge("opsloop_actuator_weight", "Integer weight last written per origin", ["edge", "listener", "origin"])
VERSION = Gauge("opsloop_actuator_applied_version", "Decision version last applied", ["edge", "listener"])
REJECTED = Counter("opsloop_actuator_rejected_records_total", "edge.weights records that are not a valid decision")
ASSIGNED = Gauge("opsloop_actuator_assigned_partitions", "edge.weights partitions assigned to this actuator")
