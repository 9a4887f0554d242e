"""A fleet's telemetry for the stream benches, and the worker's handlers run without Faust.

Shared by ``bench_stream_fleet`` (samples/s per worker with every handler on), ``bench_stream_series``
(cost per series) and ``bench_stream_scaleout`` (1..3 workers). One *round* is what a fleet's
collectors send every interval, one Kafka record per source and round (Telegraf batch shape):

* ``telemetry.lb``: per load balancer a ``haproxy`` row per server (LB rates, edge demand);
* ``telemetry.ipmi``: per server ``ipmi_power`` (power detector, anomaly detector on ``watts``) and
  ``sensors`` more ``ipmi_sensor`` rows (temperatures, fans: series the power detector skips);
* ``telemetry.iptables``: per hypervisor its VM ports and the ruleset (firewall detector);
* ``telemetry.keystone``: per API node the probe, the small-request summary and credentials
  (keystone detector, anomaly detector on ``p50_ms`` and ``small_p95_ms``);
* ``telemetry.netperf``: a few target sets (netperf detector).

``Pipeline`` runs exactly the handlers the worker runs (``opsloop.streams.worker.build_app``): the ``lb``
agent's rates + demand and the ``detectors`` agent's five detectors, plus the JSON encoding of each
touched state key (what the worker writes to the ``detector-state`` changelog once per batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import orjson

from opsloop.config import Settings
from opsloop.topics import Topic
from opsloop.streams.detectors.registry import detector_handlers
from opsloop.streams.agents.settings import DetectorsSettings
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import FanOut, decode_and_handle, gc_paused

ROUND_S = 15.0


@dataclass(frozen=True, slots=True)
class Fleet:
    """Sizes of one fleet. ``series`` is the number of distinct (name, tag set) it produces per round."""

    lbs: int = 40
    servers_per_lb: int = 50
    hosts: int = 400          # IPMI: one record per server and round
    sensors: int = 24         # ipmi_sensor rows per server besides ipmi_power
    hypervisors: int = 300    # iptables: one record per hypervisor and round
    ports: int = 30           # VM ports per hypervisor
    keystones: int = 6
    credentials: int = 20
    netperf_sets: int = 4

    @property
    def series(self) -> int:
        return (self.lbs * self.servers_per_lb + self.hosts * (1 + self.sensors)
                + self.hypervisors * (self.ports + 1) + self.keystones * (2 + self.credentials)
                + self.netperf_sets * 4)

    @classmethod
    def with_series(cls, n: int) -> "Fleet":
        """A fleet of about ``n`` series, the same mix as the default one (sizes scaled per source)."""
        base = cls()
        k = n / base.series
        return cls(lbs=max(1, round(base.lbs * k)), hosts=max(1, round(base.hosts * k)),
                   hypervisors=max(1, round(base.hypervisors * k)), keystones=max(1, round(base.keystones * k)),
                   netperf_sets=base.netperf_sets)


def _lb(lb: str, n: int, ts: float, servers: int) -> bytes:
    rows = [{"name": "haproxy", "tags": {"host": lb, "proxy": "be", "sv": f"s{j}", "type": "server"},
             "fields": {"hrsp_2xx": n * 150 + j, "stot": n * 15, "status": "UP", "weight": 100}, "timestamp": ts}
            for j in range(servers)]
    return orjson.dumps({"schema_version": 1, "metrics": rows})


def _ipmi(host: str, n: int, ts: float, sensors: int, h: int) -> bytes:
    gen = ("gen1", "gen2", "gen3")[h % 3]
    rows: list[dict[str, Any]] = [{"name": "ipmi_power", "tags": {"host": host, "source": "dcmi", "generation": gen,
                                                                  "raw_capacity_tb": "48"},
                                   "fields": {"watts": 150.0 + (h % 7) + (n % 5) * 0.5}, "timestamp": ts}]
    rows += [{"name": "ipmi_sensor", "tags": {"host": host, "name": f"temp_{j}", "unit": "degrees_c"},
              "fields": {"value": 30.0 + j + (n % 3), "status": 1}, "timestamp": ts} for j in range(sensors)]
    return orjson.dumps({"schema_version": 1, "metrics": rows})


def _iptables(hv: str, ts: float, ports: int) -> bytes:
    rows: list[dict[str, Any]] = [
        {"name": "iptables_vm_port", "tags": {"host": hv, "port_id": f"p{j}", "device": f"tap{j}", "vm": f"vm-{j}"},
         "fields": {"protected": 1, "ingress_chain": 1, "backend": "nft"}, "timestamp": ts} for j in range(ports)]
    rows.append({"name": "iptables_ruleset", "tags": {"host": hv},
                 "fields": {"fingerprint": "f" * 64, "base_fingerprint": "b" * 64, "rules": 9, "chains": 4,
                            "backend": "nft", "ports_expected": ports, "ports_protected": ports,
                            "ports_unprotected": 0}, "timestamp": ts})
    return orjson.dumps({"schema_version": 1, "metrics": rows})


def _keystone(ks: str, n: int, ts: float, credentials: int) -> bytes:
    rows: list[dict[str, Any]] = [
        {"name": "keystone_probe", "tags": {"host": ks, "probe": "token_validate"},
         "fields": {"count": 5.0, "p50_ms": 40.0 + n % 4, "p95_ms": 60.0, "max_ms": 80.0, "errors": 0.0},
         "timestamp": ts},
        {"name": "s3_frontend_requests", "tags": {"host": ks},
         "fields": {"requests": 500.0, "small_requests": 400.0, "small_p50_ms": 30.0, "small_p95_ms": 90.0 + n % 3,
                    "keystone_validations": 500.0}, "timestamp": ts}]
    rows += [{"name": "s3_frontend_credential", "tags": {"host": ks, "access_key": f"AK{j:04d}"},
              "fields": {"rank": float(j + 1), "requests": 25.0, "keystone_validations": 25.0, "share": 0.05},
              "timestamp": ts} for j in range(credentials)]
    return orjson.dumps({"schema_version": 1, "metrics": rows})


def _netperf(ts_name: str, n: int, ts: float) -> bytes:
    rows = [{"name": "netperf_throughput", "tags": {"host": "bench-1", "target_set": ts_name, "driver": "netperf",
                                                    "test": "TCP_STREAM", "queues": str(q), "kernel": "6.1"},
             "fields": {"mean_gbps": 2.0 * q ** 0.5 + (n % 3) * 0.01, "min_gbps": 1.9 * q ** 0.5, "runs": 10,
                        "failed_targets": 0, "failed": ""}, "timestamp": ts} for q in (1, 2, 4, 8)]
    return orjson.dumps({"schema_version": 1, "metrics": rows})


Record = tuple[str, bytes, bytes]   # topic, key, value


def fleet_round(f: Fleet, n: int, t0: float) -> Iterator[Record]:
    """Round ``n`` of every source of fleet ``f`` (event time ``t0 + n * ROUND_S``)."""
    ts = t0 + n * ROUND_S
    for i in range(f.lbs):
        yield Topic.LB.value, f"lb{i}".encode(), _lb(f"lb{i}", n, ts, f.servers_per_lb)
    for h in range(f.hosts):
        yield Topic.IPMI.value, f"srv{h}".encode(), _ipmi(f"srv{h}", n, ts, f.sensors, h)
    for h in range(f.hypervisors):
        yield Topic.IPTABLES.value, f"hv{h}".encode(), _iptables(f"hv{h}", ts, f.ports)
    for h in range(f.keystones):
        yield Topic.KEYSTONE.value, f"ks{h}".encode(), _keystone(f"ks{h}", n, ts, f.credentials)
    for h in range(f.netperf_sets):
        yield Topic.NETPERF.value, f"set{h}".encode(), _netperf(f"set{h}", n, ts)


def samples_in(records: Sequence[Record]) -> int:
    return sum(len(orjson.loads(v)["metrics"]) for _, _, v in records)


def bench_settings(**stream: Any) -> dict[str, Any]:
    """The config sections the benches give the worker: every detector on, anomaly on its default series
    (ipmi_power.watts, keystone_probe.p50_ms, s3_frontend_requests.small_p95_ms, uwsgi_server.listen_queue)
    with room for every server of the largest fleet."""
    return {"stream": stream, "streams": {"detectors": {"anomaly": {"max_series": 50_000}}}}


@dataclass(slots=True)
class Msg:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class Pipeline:
    """The worker's handlers on decoded batches, without Faust or Kafka (profiling, plain-loop baseline)."""

    def __init__(self, settings: Settings | None = None) -> None:
        s = settings or Settings.model_validate(bench_settings())
        self.settings = s
        self.rates = LbRates.from_settings(s.stream)
        self.demand = DemandAggregator(rates=self.rates)
        self.lb = FanOut("lb", [self.rates, self.demand])
        conf = DetectorsSettings.model_validate(s.section("streams.detectors"))
        self.detectors = detector_handlers(conf)
        for h in self.detectors:
            h.bound_state(max_clock_skew_s=s.stream.max_clock_skew_s, state_ttl_s=s.stream.state_ttl_s,
                          max_state_keys=s.stream.max_state_keys)
        self.all = FanOut("detectors", self.detectors)
        self.detector_topics = {str(t) for h in self.detectors for t in h.topics}
        self.state_bytes = 0
        self.state_keys = 0
        self.demand_records = 0
        self.outbox: list[tuple[str, bytes, bytes]] = []   # (topic, key, value) the worker would send

    def handle(self, msgs: Sequence[Any]) -> int:
        """One fetched batch (any topics), as the worker's two agents take it: decode and handle (the
        runtime's code, GC paused), encode the demand records and every touched state key (what the
        worker sends to ``edge.demand`` and the ``detector-state`` changelog); returns the samples."""
        lb = [m for m in msgs if m.topic == Topic.LB.value]
        det = [m for m in msgs if m.topic in self.detector_topics]
        n = 0
        if lb:
            with gc_paused():
                n += len(decode_and_handle("lb", lb, self.lb).metrics)
            for rec in self.demand.drain():
                self.outbox.append((Topic.EDGE_DEMAND.value, rec.key.encode(), rec.encode()))
                self.demand_records += 1
        if det:
            with gc_paused():
                n += len(decode_and_handle("detectors", det, self.all).metrics)
            for h in self.detectors:
                h.drain_outbox()
                for key in h.touched():
                    state = h.state_of(key)
                    if state is not None:
                        value = orjson.dumps(state)
                        self.state_bytes += len(value)
                        self.state_keys += 1
                        self.outbox.append(("detector-state", f"{h.name}|{key}".encode(), value))
        return n

    def drain(self) -> list[tuple[str, bytes, bytes]]:
        out, self.outbox = self.outbox, []
        return out
