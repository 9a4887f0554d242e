"""Telemetry that reaches every partition, and what a worker shows of it (scale-out test, fail-over bench).

Load balancers (``telemetry.lb``, agent ``lb``, no table) and hypervisors (``telemetry.iptables``,
agent ``detectors``, state in the changelogged ``detector-state`` table) keyed so that each of the
``PARTITIONS`` partitions has at least one of each: "every partition processed" is then visible in a
worker's /metrics (an LB's request rate, a hypervisor's report timestamp).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.partitioner.default import murmur2

from opsloop.stack import free_port
from opsloop.records import metric
from opsloop.topics import Topic
from opsloop.wire import encode_batch
from tests.helpers import scrape_metric, write_config

PARTITIONS = 4


def partition_of(key: str, partitions: int = PARTITIONS) -> int:
    """The producer's partition for ``key`` (kafka-python's murmur2 partitioner, as the collectors use)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def keys_covering(prefix: str, per_partition: int = 1, partitions: int = PARTITIONS) -> list[str]:
    """``per_partition`` keys ``<prefix><n>`` landing in each partition (deterministic for a prefix)."""
    got: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for n in itertools.count():
        key = f"{prefix}{n}"
        bucket = got[partition_of(key, partitions)]
        if len(bucket) < per_partition:
            bucket.append(key)
        if all(len(b) == per_partition for b in got.values()):
            return sorted(k for b in got.values() for k in b)
    raise AssertionError("unreachable")


def lb_round(lb: str, count: int, ts: float) -> bytes:
    """Server s1 of ``lb`` with its cumulative request counter at event time ``ts``."""
    return encode_batch([metric("haproxy", {"hrsp_2xx": count, "status": "UP", "weight": 10},
                                {"host": lb, "proxy": "be", "sv": "s1", "type": "server"}, ts)])


def fw_round(hv: str, ts: float, fixed: bool = False) -> bytes:
    """One protected and one unprotected VM port on ``hv`` (``fixed``: both protected, its finding clears)."""
    ports = {"p-open": fixed, "p-safe": True}
    samples = [metric("iptables_vm_port", {"protected": int(ok), "ingress_chain": int(ok), "backend": "nft",
                                           **({} if ok else {"reason": "ingress chain missing"})},
                      {"host": hv, "port_id": p, "device": f"tap{p}", "vm": f"vm-{p}"}, ts) for p, ok in ports.items()]
    samples.append(metric("iptables_ruleset", {"fingerprint": "f" * 64, "base_fingerprint": "b" * 64, "rules": 9,
                                               "chains": 4, "backend": "nft", "ports_expected": 2,
                                               "ports_protected": 1 + fixed, "ports_unprotected": 1 - fixed},
                          {"host": hv}, ts))
    return encode_batch(samples)


def group_assignment(bootstrap: str, group: str) -> dict[str, set[tuple[str, int]]]:
    """member id -> assigned (topic, partition) of a Stable consumer group, as the broker reports it.

    kafka-python 3 calls ``describe_consumer_groups`` ``describe_groups`` and returns plain dicts.
    """
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        desc = admin.describe_groups([group])[group]
    finally:
        admin.close()
    if desc.get("error") or desc.get("group_state") != "Stable":
        return {}
    out: dict[str, set[tuple[str, int]]] = {}
    for m in desc["members"]:
        assignment = m.get("member_assignment") or {}
        out[m["member_id"]] = {(a["topic"], p) for a in assignment.get("assigned_partitions", [])
                               for p in a["partitions"]}
    return out


def second_worker_config(tmp: Path, doc: dict[str, Any], name: str = "2") -> tuple[Path, dict[str, Any]]:
    """Same app id and topics, its own ports and state directory."""
    doc2 = {**doc, "stream": {**doc["stream"], "metrics_port": free_port(), "web_port": free_port(),
                              "data_dir": str(tmp / f"streams-{name}")}}
    return write_config(tmp / f"opsloop-{name}.yaml", doc2), doc2


class Telemetry:
    """Rounds of LB counters and firewall reports, one second of event time apart.

    ``per_s`` (requests per second of each LB) can change between rounds; a worker that processed a
    round after the change shows the new rate for that LB.
    """

    def __init__(self, producer: KafkaProducer, lbs: list[str], hvs: list[str], t0: float) -> None:
        self.producer, self.lbs, self.hvs, self.t0 = producer, lbs, hvs, t0
        self.per_s = {lb: 10 * (i + 1) for i, lb in enumerate(lbs)}
        self.counters = {lb: 0 for lb in lbs}
        self.rounds = 0
        self.fixed: set[str] = set()   # hypervisors whose open port is protected from the next round on

    def ts(self, n: int) -> float:
        return self.t0 + n

    def send(self, hvs: list[str] | None = None) -> int:
        """One round to every LB and to ``hvs`` (default: all); returns the round's number."""
        n = self.rounds
        self.rounds += 1
        for lb in self.lbs:
            self.counters[lb] += self.per_s[lb] if n else 0
            self.producer.send(Topic.LB.value, key=lb.encode(), value=lb_round(lb, self.counters[lb], self.ts(n)))
        for hv in self.hvs if hvs is None else hvs:
            self.producer.send(Topic.IPTABLES.value, key=hv.encode(), value=fw_round(hv, self.ts(n), hv in self.fixed))
        self.producer.flush()
        return n

    def scale_rates(self, factor: float) -> None:
        self.per_s = {lb: round(v * factor) for lb, v in self.per_s.items()}

    def rates(self, port: int) -> dict[str, float]:
        return {lb: v for lb in self.lbs
                if (v := scrape_metric(port, "opsloop_lb_server_requests_per_second", {"lb": lb, "server": "s1"})) is not None}

    def report_ts(self, port: int) -> dict[str, float]:
        return {hv: v for hv in self.hvs if (v := scrape_metric(
            port, "opsloop_firewall_report_timestamp_seconds", {"hypervisor": hv})) is not None}

    def lagging(self, port: int, since_round: int) -> dict[str, int]:
        """Keys (LB or hypervisor) -> partition, of those whose rounds from ``since_round`` on the worker
        on ``port`` has not shown yet (an LB: its current rate; a hypervisor: a report that recent)."""
        rates, reports = self.rates(port), self.report_ts(port)
        out = {lb: partition_of(lb) for lb in self.lbs if abs(rates.get(lb, -1.0) - self.per_s[lb]) > 1e-6 * self.per_s[lb]}
        out.update({hv: partition_of(hv) for hv in self.hvs if reports.get(hv, 0) < self.ts(since_round)})
        return out
