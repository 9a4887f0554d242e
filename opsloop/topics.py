"""Kafka topics and routing: which topic a telemetry sample goes to and under which key.

Telemetry has one topic per signal family; the derived topics carry findings, demand, weights and the
audit trail. A sample is routed by the prefix of its metric name (our collectors' and Telegraf's input
names) unless its ``opsloop_topic`` tag names a topic; its key is the source of the series, so one series
always lands in one partition (a power reading's: its server's generation, see ``TOPIC_KEY_TAGS``).
``kafka.topic_prefix`` is applied by the clients, not here.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Mapping

from opsloop.validation import WireError


class Topic(str, enum.Enum):
    """Kafka topics. Telemetry per signal family; derived topics for findings and decisions."""

    IPMI = "telemetry.ipmi"
    NETPERF = "telemetry.netperf"
    KEYSTONE = "telemetry.keystone"
    IPTABLES = "telemetry.iptables"
    LB = "telemetry.lb"
    DEADLETTER = "telemetry.deadletter"
    FINDINGS = "findings"
    EDGE_DEMAND = "edge.demand"
    EDGE_WEIGHTS = "edge.weights"
    AUDIT = "audit"

    def __str__(self) -> str:  # so f"{Topic.LB}" is the topic name
        return self.value


TELEMETRY_TOPICS: tuple[Topic, ...] = (Topic.IPMI, Topic.NETPERF, Topic.KEYSTONE, Topic.IPTABLES, Topic.LB)

# Metric name prefix -> topic. Covers our collectors and Telegraf's input names
# (ipmi_sensor, iptables, ipvs_*, haproxy).
_PREFIX_TOPIC: tuple[tuple[str, Topic], ...] = (
    ("ipmi", Topic.IPMI),
    ("power", Topic.IPMI),
    ("netperf", Topic.NETPERF),
    ("iperf", Topic.NETPERF),
    ("keystone", Topic.KEYSTONE),
    ("uwsgi", Topic.KEYSTONE),
    ("s3_frontend", Topic.KEYSTONE),
    ("iptables", Topic.IPTABLES),
    ("firewall", Topic.IPTABLES),
    ("haproxy", Topic.LB),
    ("ipvs", Topic.LB),
    ("lvs", Topic.LB),
    ("lb_", Topic.LB),
    ("edge_", Topic.LB),
)

# Tag that overrides routing (Telegraf: set it in [inputs.X.tags] and use it as outputs.kafka topic_tag).
TOPIC_TAG = "opsloop_topic"
# Tags that identify the series' source, in order of preference, for the record key. A netperf target
# set first: its state (baseline, open drop) is per set while any host may measure it, and keyed by the
# host a set measured from another host came from another partition, its state living in two.
KEY_TAGS = ("target_set", "host", "edge", "server", "hypervisor", "instance")
# Tags tried before KEY_TAGS for one topic's records. A server's power reading by its generation: the power
# detector compares each server with its generation's median, so all of them must reach one worker; keyed by
# host, each of N stream workers compared the servers of its own partitions (a share). Per topic, so no other
# topic's keys move. A reading without the tag (its generation only in the detector's config) keeps its host.
TOPIC_KEY_TAGS: Mapping[Topic, tuple[str, ...]] = MappingProxyType({Topic.IPMI: ("generation",)})


def topic_for(name: str, tags: Mapping[str, str]) -> Topic:
    explicit = tags.get(TOPIC_TAG)
    if explicit:
        try:
            return Topic(explicit)
        except ValueError:
            raise WireError(f"tag {TOPIC_TAG}={explicit!r} is not a known topic") from None
    for prefix, topic in _PREFIX_TOPIC:
        if name.startswith(prefix):
            return topic
    raise WireError(f"name {name!r} maps to no telemetry topic (set tag {TOPIC_TAG})")


def series_key(name: str, tags: Mapping[str, str], topic: Topic | None = None) -> str:
    """Kafka key: the source of the series, so one series always lands in one partition (``topic``: the
    sample's, when the caller has it; else found here, and a sample of no topic keyed by KEY_TAGS alone)."""
    if topic is None:
        try:
            topic = topic_for(name, tags)
        except WireError:
            topic = None
    first = TOPIC_KEY_TAGS.get(topic, ()) if topic is not None else ()
    for t in (*first, *KEY_TAGS):
        v = tags.get(t)
        if v:
            return v
    return name
