"""Stream-stage hardening: samples from the future, one dead letter per bad record, bounded handler
state, the power detector's work per batch, and unambiguous finding ids and series keys.

Each test drives the real decode path (``opsloop.streams.runtime.batch``) or the real handlers; nothing is
timed (the power test counts comparisons, not seconds).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.records import Finding
from opsloop.labels import label_string
from opsloop.records import DEADLETTER_VALUE_LIMIT, Metric, metric
from opsloop.wire import encode_batch
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.findingbook import where_key
from opsloop.records import EdgeDemand
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import DeadLetter, decode_messages, process_batch
from tests.streams.agents.test_runtime import Msg


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def watts(host: str, w: float, ts: float, generation: str = "gen3") -> Metric:
    return metric("ipmi_power", {"watts": w}, {"host": host, "generation": generation, "raw_capacity_tb": "96"}, ts)


def run(messages: list[Msg], handler: Any) -> list[DeadLetter]:
    letters: list[DeadLetter] = []

    async def send(dl: DeadLetter) -> None:
        letters.append(dl)

    asyncio.run(process_batch("test", messages, handler, send))
    return letters


# ------------------------------------------------------------------------------ samples from the future
def test_a_future_sample_is_dead_lettered_and_the_rest_of_its_batch_processed() -> None:
    now = time.time()
    before = counter("opsloop_stream_rejected_samples_total", topic="telemetry.ipmi", reason="future")
    batch = encode_batch([watts("fut-a", 150.0, now - 10), watts("fut-b", 150.0, now + 86_400 * 365),
                          watts("fut-c", 151.0, now - 5)])
    out = decode_messages([Msg("telemetry.ipmi", 0, 7, b"k", batch)], now=now, max_clock_skew_s=300)
    assert [m.tags["host"] for m in out.metrics] == ["fut-a", "fut-c"]
    assert len(out.deadletters) == 1
    dl = out.deadletters[0]
    assert dl.reason.startswith("metrics.1.timestamp: ") and "stream.max_clock_skew_s" in dl.reason
    assert repr(now + 86_400 * 365)[:8] in dl.reason and dl.offset == 7
    assert dl.value["tags"]["host"] == "fut-b"
    assert counter("opsloop_stream_rejected_samples_total", topic="telemetry.ipmi", reason="future") == before + 1
    # within the skew is accepted (clocks differ a little)
    near = decode_messages([Msg("telemetry.ipmi", 0, 8, b"k", encode_batch([watts("fut-d", 1.0, now + 200)]))],
                           now=now, max_clock_skew_s=300)
    assert len(near.metrics) == 1 and not near.deadletters


def test_a_future_sample_no_longer_freezes_the_power_handler() -> None:
    """Before: the future reading set the host's replay guard, every later reading was dropped."""
    h = PowerHandler()
    now = time.time()
    msgs = [Msg("telemetry.ipmi", 0, i, b"pin", encode_batch([watts("pin-host", 150.0, now - 60 + i)]))
            for i in range(3)]
    msgs.append(Msg("telemetry.ipmi", 0, 3, b"pin", encode_batch([watts("pin-host", 150.0, 4_000_000_000.0)])))
    letters = run(msgs, h)
    assert len(letters) == 1 and "timestamp" in letters[0].reason
    n = h.detector.sums["pin-host"][1]
    run([Msg("telemetry.ipmi", 0, 4, b"pin", encode_batch([watts("pin-host", 300.0, now)]))], h)
    assert h.detector.sums["pin-host"][1] == n + 1


def test_a_restored_replay_guard_from_the_future_does_not_pin_the_series() -> None:
    now = time.time()
    h = PowerHandler()
    h.handle([watts("rs-host", 150.0, now - 30 + i) for i in range(3)], now)
    state = orjson.loads(orjson.dumps(h.state_of("rs-host")))
    state["last_ts"] = 4_000_000_000.0            # what a worker without the stage check persisted
    fresh = PowerHandler()
    fresh.restore({"rs-host": state})
    fresh.handle([watts("rs-host", 150.0, now)], now)
    assert fresh.detector.sums["rs-host"][1] == 4
    # a plain restored guard still stops a replay
    fresh.handle([watts("rs-host", 999.0, now - 1)], now)
    assert fresh.detector.sums["rs-host"][1] == 4


def test_a_future_demand_record_does_not_pin_the_demand_book() -> None:
    received = 1_795_000_000.0
    book = DemandBook(clock=lambda: received)
    future = EdgeDemand(edge="e1", backend="be", demand_rps=0.0, timestamp=4_000_000_000.0)
    assert book.update(future) is False and book.get("be", "e1") is None
    assert book.update(EdgeDemand(edge="e1", backend="be", demand_rps=42.0, timestamp=received - 1))
    assert book.get("be", "e1").demand_rps == 42.0         # type: ignore[union-attr]


# ------------------------------------------------------------------------------ one dead letter per record
def test_one_dead_letter_per_bad_record_with_a_bounded_excerpt() -> None:
    now = time.time()
    good = {"name": "haproxy", "tags": {"host": "lb1"}, "fields": {"stot": 1}, "timestamp": now}
    samples = [{**good, "fields": {"stot": [1] * 20}} for _ in range(20_000)] + [good]
    raw = orjson.dumps({"schema_version": 1, "metrics": samples})
    assert len(raw) > 1_000_000
    out = decode_messages([Msg("telemetry.lb", 2, 9, b"lb1", raw)], now=now)
    assert len(out.metrics) == 1
    assert len(out.deadletters) == 1
    dl = out.deadletters[0]
    assert dl.reason.startswith("20000 of 20001 samples rejected (1 kept): metrics.0.fields.stot")
    assert "and 19995 more" in dl.reason
    encoded = dl.encode()
    assert len(encoded) < DEADLETTER_VALUE_LIMIT
    doc = orjson.loads(encoded)
    assert doc["value"]["rejected_samples"] == 20_000 and len(doc["value"]["first_rejected"]) == 20
    assert doc["offset"] == 9 and doc["partition"] == 2


def test_a_single_bad_sample_keeps_its_own_reason_and_value() -> None:
    now = time.time()
    good = {"name": "haproxy", "tags": {"host": "lb1"}, "fields": {"stot": 1}, "timestamp": now}
    raw = orjson.dumps({"schema_version": 1, "metrics": [good, {**good, "fields": {"b": None}}]})
    out = decode_messages([Msg("telemetry.lb", 0, 1, None, raw)], now=now)
    assert len(out.metrics) == 1 and len(out.deadletters) == 1
    assert out.deadletters[0].reason.startswith("metrics.1.fields.b")
    assert out.deadletters[0].value["fields"] == {"b": None}


# ------------------------------------------------------------------------------ bounded state
def test_power_state_of_silent_hosts_expires_with_its_gauges_and_findings() -> None:
    h = PowerHandler()
    h.bound_state(max_clock_skew_s=300, state_ttl_s=600, max_state_keys=100_000)
    t0 = 1_795_000_000.0
    before = counter("opsloop_stream_state_dropped_total", handler="power-detector", reason="ttl")
    batch = [watts(f"ttl-{i}", 150.0 + (90.0 if i == 0 else 0.0), t0 + k, "gttl")
             for k in range(3) for i in range(3000)]
    h.handle(batch, t0)
    assert len(h.detector.sums) == 3000 and gauge("opsloop_power_watts", host="ttl-1", generation="gttl")
    opened = [f for e, f in h.drain_outbox() if e == "opened" and f.detector == "power.generation_deviation"]
    assert [f.where["host"] for f in opened] == ["ttl-0"]
    h.handle([watts("ttl-new", 150.0, t0 + 10_000, "gother")], t0 + 10_000)
    assert set(h.detector.sums) == {"ttl-new"} and set(h.last_ts) == {"ttl-new"}
    assert gauge("opsloop_power_watts", host="ttl-1", generation="gttl") is None
    assert gauge("opsloop_power_generation_median_watts", generation="gttl") is None
    assert counter("opsloop_stream_state_dropped_total", handler="power-detector", reason="ttl") == before + 3000
    cleared = [f for e, f in h.drain_outbox() if e == "cleared"]
    assert [f.where["host"] for f in cleared if f.detector == "power.generation_deviation"] == ["ttl-0"]
    assert "no telemetry" in cleared[0].explanation
    touched = h.touched()
    assert "ttl-5" in touched and h.state_of("ttl-5") is None      # deleted from the state table


def test_handlers_keep_at_most_the_cap_least_recently_seen_first() -> None:
    t0 = 1_795_000_000.0
    h = FirewallHandler()
    h.bound_state(max_clock_skew_s=300, state_ttl_s=1e9, max_state_keys=50)
    for i in range(120):
        h.handle([metric("iptables_vm_port", {"protected": 1}, {"host": f"cap-{i}", "port_id": "p", "vm": "v"},
                         t0 + i)], t0 + i)
    assert sorted(h.detector.latest) == sorted(f"cap-{i}" for i in range(70, 120))
    assert gauge("opsloop_firewall_report_timestamp_seconds", hypervisor="cap-3") is None
    assert gauge("opsloop_firewall_report_timestamp_seconds", hypervisor="cap-119") == t0 + 119
    assert counter("opsloop_stream_state_dropped_total", handler="firewall-detector", reason="cap") >= 70


def test_netperf_and_keystone_state_is_bounded_too() -> None:
    t0 = 1_795_000_000.0
    n = NetperfHandler()
    n.bound_state(max_clock_skew_s=300, state_ttl_s=100, max_state_keys=1000)
    n.handle([metric("netperf_throughput", {"mean_gbps": 9.0}, {"target_set": f"np-{i}", "queues": "4"}, t0)
              for i in range(30)], t0)
    assert len(n.detectors) == 30
    n.handle([], t0 + 500)
    assert n.detectors == {} and n.last_ts == {}
    assert gauge("opsloop_netperf_throughput_bytes_per_second", target_set="np-1", label="", queues="4") is None
    k = KeystoneHandler()
    k.bound_state(max_clock_skew_s=300, state_ttl_s=100, max_state_keys=1000)
    k.handle([metric("keystone_probe", {"p50_ms": 9.0, "count": 5}, {"host": f"ks-{i}", "probe": "token_validate"},
                     t0) for i in range(30)], t0)
    assert len(k.hosts) == 30
    k.handle([], t0 + 500)
    assert k.hosts == {}


def test_lb_rates_and_demand_status_forget_silent_servers() -> None:
    t0 = 1_795_000_000.0
    rates = LbRates(ttl_s=120, max_series=100_000)
    demand = DemandAggregator(rates=rates)

    def row(sv: str, ts: float, count: int) -> Metric:
        return metric("haproxy", {"stot": count, "status": "UP", "weight": 10},
                      {"host": "lbx", "proxy": "be", "sv": sv, "type": "server"}, ts)

    for step in range(2):
        batch = [row(f"s{i}", t0 + 15 * step, 100 * step) for i in range(3000)]
        rates.handle(batch, t0 + 15 * step)
        demand.handle(batch, t0 + 15 * step)
    assert len(demand.status) == 3000 and gauge("opsloop_lb_server_up", lb="lbx", backend="be", server="s7") == 1.0
    assert gauge("opsloop_lb_server_requests_per_second", lb="lbx", backend="be", server="s7") == pytest.approx(100 / 15)
    later = [row("s0", t0 + 10_000, 1)]
    rates.handle(later, t0 + 10_000)
    demand.handle(later, t0 + 10_000)
    assert set(demand.status) == {("lbx", "be", "s0")}
    assert gauge("opsloop_lb_server_up", lb="lbx", backend="be", server="s7") is None
    assert gauge("opsloop_lb_server_weight", lb="lbx", backend="be", server="s7") is None
    assert gauge("opsloop_lb_server_requests_per_second", lb="lbx", backend="be", server="s7") is None
    assert list(rates.servers("lbx", "be")) == []     # s0 starts afresh: no rate across the silence
    capped = LbRates(ttl_s=1e9, max_series=10)
    capped.handle([row(f"c{i}", t0, 1) for i in range(25)], t0)
    assert len(capped._last) == 10


def test_a_future_lb_sample_stops_pinning_its_series_after_the_ttl() -> None:
    t0 = 1_795_000_000.0
    rates = LbRates(ttl_s=120)
    rates.handle([metric("haproxy", {"stot": 1}, {"host": "lbf", "proxy": "be", "type": "backend"},
                         4_000_000_000.0)], t0)
    for k in range(1, 20):     # ignored while the future sample is the newest, until it expires
        rates.handle([metric("haproxy", {"stot": 15 * k}, {"host": "lbf", "proxy": "be", "type": "backend"},
                             t0 + 15 * k)], t0 + 15 * k)
    assert rates.latest[("lbf", "backend", "be", "")].timestamp > t0


# ------------------------------------------------------------------------------ power detector cost
def test_power_compares_each_generation_once_per_batch_not_once_per_sample() -> None:
    h = PowerHandler()
    t0 = 1_795_000_000.0
    hosts = 1000
    h.handle([watts(f"q-{i}", 150.0, t0 + k, f"gq{i % 3}") for k in range(3) for i in range(hosts)], t0)
    h.detector.deviation_work = 0
    h.handle([watts(f"q-{i}", 151.0, t0 + 10, f"gq{i % 3}") for i in range(hosts)], t0 + 10)
    # one comparison per server and batch; per sample it was hosts * hosts / 3
    assert 0 < h.detector.deviation_work <= hosts


# ------------------------------------------------------------------------------ ids and series keys
def test_label_string_is_unambiguous_and_keeps_plain_ids() -> None:
    assert label_string({"host": "a,port=1"}) != label_string({"host": "a", "port": "1"})
    assert label_string({"a": "x|y"}) != label_string({"a": "x", "|y": ""})
    plain = {"hypervisor": "hv-3", "vm": "web-1", "port": "p1"}
    f = Finding(detector="firewall.unprotected_port", what="w", where=plain, first_seen=1.0, last_seen=1.0)
    old = hashlib.sha1(("firewall.unprotected_port|" + ",".join(f"{k}={v}" for k, v in sorted(plain.items())))
                       .encode()).hexdigest()[:16]
    assert f.id == old                                   # existing ids of plain values stay put
    a = Finding(detector="d.x", what="w", where={"host": "a,port=1"}, first_seen=1.0, last_seen=1.0)
    b = Finding(detector="d.x", what="w", where={"host": "a", "port": "1"}, first_seen=1.0, last_seen=1.0)
    assert a.id != b.id
    assert where_key("d.x", a.where) != where_key("d.x", b.where)
