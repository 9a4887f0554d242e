"""Prometheus gauges of the edge control service (names used by alert rules and dashboards)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from opsloop.controllers.metrics import EDGE_FAIL_STATIC

WEIGHT = Gauge("opsloop_edge_weight", "Published traffic share of an origin for a listener and edge",
               ["listener", "edge", "origin"])
DEMAND = Gauge("opsloop_edge_demand_requests_per_second", "Measured request rate of a listener at an edge",
               ["listener", "edge"])
# Per listener: an origin behind several listeners has a capacity (and a load) in each topology.
CAPACITY = Gauge("opsloop_edge_origin_capacity_requests_per_second", "Policy capacity of an origin for a listener",
                 ["listener", "origin"])
LOAD = Gauge("opsloop_edge_origin_load_requests_per_second",
             "Measured request rate a listener's edges send to an origin", ["listener", "origin"])
HEALTHY = Gauge("opsloop_edge_origin_healthy", "1 when the controller considers the origin healthy",
                ["listener", "origin"])
FAIL_STATIC = EDGE_FAIL_STATIC  # shared definition: controllers/metrics.py
VERSION = Gauge("opsloop_edge_decision_version", "Version of the last published weights", ["listener"])
MODE = Gauge("opsloop_edge_mode", "1 for the mode of the last decision", ["listener", "mode"])
INPUTS_AGE = Gauge("opsloop_edge_inputs_age_seconds", "Age of the demand the last decision used", ["listener"])
SHED = Gauge("opsloop_edge_shed_requests_per_second", "Demand above healthy capacity (shed fairly)", ["listener"])
TICKS = Counter("opsloop_edge_ticks_total", "Controller intervals run", ["listener", "outcome"])
# the loop's liveness: /metrics answers from its own thread, so a hung loop still scrapes with its last gauges
LAST_TICK = Gauge("opsloop_edge_last_tick_timestamp_seconds", "Unix time the control loop last finished an interval "
                  "(any outcome)")
INTERVAL = Gauge("opsloop_edge_interval_seconds", "The control loop's interval (controllers.edge.interval_s)")
TICK_SECONDS = Histogram("opsloop_edge_tick_seconds", "Time to decide and publish one interval",
                         buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
PUBLISH_ERRORS = Counter("opsloop_edge_publish_errors_total", "Records Kafka did not acknowledge", ["topic"])
DEMAND_REJECTED = Counter("opsloop_edge_demand_rejected_total",
                          "edge.demand records not used (invalid, or stamped in the future)", ["reason"])
# reason: ttl (an entry not updated for ttl_s: an LB or backend gone), superseded (a record older than the one kept:
# a replay or out of order), unknown_cap (an entry of a key the topology does not read, evicted past max_unknown_keys)
DEMAND_DROPPED = Counter("opsloop_edge_demand_dropped_total",
                         "Demand entries or records dropped by the controller's demand book", ["reason"])
API_REQUESTS_CUT = Counter("opsloop_edge_api_requests_cut_total",
                           "Edge API requests cut off unanswered: not whole within timeout_s (reason: headers, body)",
                           ["reason"])
API_TOKEN_USABLE = Gauge("opsloop_edge_api_token_usable",
                         "1 while the edge API has a usable bearer token; 0 while it refuses every request (503)")
# the token gauge reads 0 with the API off too: EdgeApiTokenUnusable needs to know the API is on
API_SERVING = Gauge("opsloop_edge_api_serving", "1 once the edge API serves requests (controllers.edge.api.enabled)")
for _reason in ("ttl", "superseded", "unknown_cap"):   # exported at 0: increase() sees the first drop
    DEMAND_DROPPED.labels(_reason)
for _reason in ("headers", "body"):
    API_REQUESTS_CUT.labels(_reason)
