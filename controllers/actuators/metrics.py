"""Prometheus metrics of the weight actuators (default registry, served by ``serve_metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from opsloop.controllers.metrics import EDGE_FAIL_STATIC

APPLIES = Counter("opsloop_actuator_applies_total", "Decisions handled by result",
                  ["edge", "listener", "result"])
ERRORS = Counter("opsloop_actuator_errors_total",
                 "Actuator errors (unreachable target, command, mismatch, store = weight history unusable, ...)",
                 ["edge", "kind"])
SHADOW_DIFF = Gauge("opsloop_actuator_shadow_diff",
                    "Shadow mode: fraction of traffic the decision would move vs the live weights (0..1)",
                    ["edge", "listener"])
FAIL_STATIC = EDGE_FAIL_STATIC  # shared definition: controllers/metrics.py
WEIGHT = Gauge("opsloop_actuator_weight", "Integer weight last written per origin", ["edge", "listener", "origin"])
VERSION = Gauge("opsloop_actuator_applied_version", "Decision version last applied", ["edge", "listener"])
REFUSED_IN_A_ROW = Gauge("opsloop_actuator_refused_decisions",
                         "Decisions refused in a row (stale version, clock skew, all-zero, only DOWN origins) since "
                         "the last one applied or found already live; alerted by EdgeWeightActuatorRefusedInARow",
                         ["edge", "listener"])
LEFT_ALONE = Gauge("opsloop_actuator_servers_left_alone",
                   "Configured servers the actuator does not write, as of its last health read: reason=absent (the "
                   "LB has no such server), reason=agent_weight (an HAProxy agent check sets its weight)",
                   ["edge", "listener", "reason"])
GIVEN_UP = Counter("opsloop_actuator_decisions_given_up_total",
                   "Decisions given up after max_apply_attempts applies ended in a read-back mismatch or an internal "
                   "error (audited failed; an internal error's record dead-lettered)", ["edge", "listener", "reason"])
FINDING_SEND_FAILURES = Counter("opsloop_actuator_finding_send_failures_total",
                                "Sends of a finding (edge.fail_static) the broker did not take; each is retried",
                                ["edge", "listener"])
FINDINGS_QUEUED = Gauge("opsloop_actuator_findings_queued",
                        "Finding states waiting for the broker (retried in order per finding id)", ["edge", "listener"])
FINDINGS_DROPPED = Counter("opsloop_actuator_findings_dropped_total",
                           "Older finding states dropped unsent: more than the bound waited for the broker",
                           ["edge", "listener"])
COMMIT_FAILURES = Counter("opsloop_actuator_commit_failures_total",
                          "Offset commits of edge.weights the broker did not take within the bound (retried)")
REJECTED = Counter("opsloop_actuator_rejected_records_total", "edge.weights records that are not a valid decision")
ASSIGNED = Gauge("opsloop_actuator_assigned_partitions", "edge.weights partitions assigned to this actuator")
# /metrics is served from its own thread: a run loop that hangs still answers scrapes (up == 1); this does not move
LAST_POLL = Gauge("opsloop_actuator_last_poll_timestamp_seconds", "When edge.weights was last polled (the run loop)")


def set_family(gauge: Gauge, prefix: tuple[str, ...], values: dict[str, float]) -> None:
    """Set ``gauge{prefix..., last}`` for each item of ``values`` and remove the children under
    ``prefix`` whose last label is no longer there (a gauge must not keep every label it ever saw)."""
    n = len(prefix)
    for labels in [s.labels for m in gauge.collect() for s in m.samples]:
        key = tuple(labels[name] for name in gauge._labelnames)  # noqa: SLF001 - order of the label names
        if key[:n] == prefix and key[n] not in values:
            try:
                gauge.remove(*key)
            except KeyError:
                pass
    for last, value in values.items():
        gauge.labels(*prefix, last).set(value)


# alerted by EdgeWeightActuatorFencedWriter
FENCED_WRITER = Gauge("opsloop_actuator_fenced_writer",
                      "1 while decisions of an older controller epoch than the one in force keep arriving (within "
                      "stale_after_s): a second controller instance publishes, its decisions refused (fenced)",
                      ["edge", "listener"])
