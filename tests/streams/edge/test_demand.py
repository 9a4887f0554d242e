"""The edge demand aggregator: HAProxy counter samples → per-edge, per-backend demand records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import REGISTRY

from opsloop.records import metric
from opsloop.records import EdgeDemand
from opsloop.streams.edge.demand import DemandAggregator, server_up
from tests.helpers import REPO

T0 = 1_795_000_000.0


def server(lb: str, backend: str, sv: str, count: int, ts: float, status: str = "UP"):
    return metric("haproxy", {"hrsp_2xx": count, "hrsp_5xx": 0, "status": status, "weight": 100},
                  {"host": lb, "proxy": backend, "sv": sv, "type": "server"}, ts)


def test_demand_is_the_sum_of_server_rates_per_edge_and_backend() -> None:
    agg = DemandAggregator()
    assert agg.handle([server("e1", "be_web", "near", 0, T0), server("e1", "be_web", "far", 0, T0)], T0) == []
    out = agg.handle([server("e1", "be_web", "near", 40, T0 + 2), server("e1", "be_web", "far", 100, T0 + 2)], T0 + 2)
    assert len(out) == 1
    rec = out[0]
    assert (rec.edge, rec.backend, rec.key) == ("e1", "be_web", "be_web|e1")
    assert rec.demand_rps == pytest.approx(70.0)
    assert rec.origins["near"].rps == pytest.approx(20.0) and rec.origins["far"].rps == pytest.approx(50.0)
    assert rec.timestamp == T0 + 2
    assert agg.drain() == out and agg.drain() == []


def test_edges_are_kept_apart_and_down_servers_are_reported() -> None:
    agg = DemandAggregator()
    agg.handle([server("e1", "be", "a", 0, T0), server("e2", "be", "a", 0, T0)], T0)
    out = agg.handle([server("e1", "be", "a", 10, T0 + 1, "DOWN"), server("e2", "be", "a", 30, T0 + 1, "UP 1/2")],
                     T0 + 1)
    by_edge = {r.edge: r for r in out}
    assert by_edge["e1"].demand_rps == pytest.approx(10) and by_edge["e2"].demand_rps == pytest.approx(30)
    assert by_edge["e1"].origins["a"].up is False and by_edge["e2"].origins["a"].up is True


def test_counter_reset_gives_no_negative_demand() -> None:
    agg = DemandAggregator()
    agg.handle([server("e1", "be", "a", 500, T0)], T0)
    assert agg.handle([server("e1", "be", "a", 3, T0 + 1)], T0 + 1) == []
    out = agg.handle([server("e1", "be", "a", 13, T0 + 2)], T0 + 2)
    assert out[0].demand_rps == pytest.approx(10)


@pytest.mark.parametrize("status,up", [("UP", True), ("DRAIN", True), ("no check", True), ("DOWN", False),
                                       ("DOWN 1/2", False), ("MAINT", False), ("MAINT (via be/x)", False),
                                       (None, True)])
def test_server_status(status, up) -> None:
    assert server_up(status) is up


def test_record_round_trip_and_errors_name_the_field() -> None:
    rec = EdgeDemand(edge="e", backend="b", demand_rps=3.5, timestamp=T0)
    assert EdgeDemand.decode(rec.encode()) == rec
    with pytest.raises(ValueError, match="demand_rps"):
        EdgeDemand.decode(b'{"edge":"e","backend":"b","demand_rps":-1,"timestamp":1795000000}')
    with pytest.raises(ValueError, match="not JSON"):
        EdgeDemand.decode(b"{nope")
    with pytest.raises(ValueError, match="schema_version"):
        EdgeDemand.decode(b'{"schema_version":9,"edge":"e","backend":"b","demand_rps":1,"timestamp":1}')


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.dictionaries(st.sampled_from(["edge", "backend", "demand_rps", "timestamp", "origins", "x"]),
                                 st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=5),
                                           st.dictionaries(st.text(max_size=3), st.integers(-2**63, 2**63 - 1), max_size=2)),
                                 max_size=6).map(lambda d: __import__("orjson").dumps(d))))
def test_decode_fuzz_raises_only_value_error(raw: bytes) -> None:
    try:
        rec = EdgeDemand.decode(raw)
    except ValueError:
        return
    assert rec.demand_rps >= 0 and rec.edge and rec.backend


def test_collector_rows_of_real_show_stat_output() -> None:
    """Rows as the haproxy collector emits them from HAProxy 2.6 ``show stat`` (testdata)."""
    from opsloop.collectors.haproxy.collector import row_to_metric
    from opsloop.lb.haproxy import parse_show_stat

    text = (REPO / "collectors/haproxy/testdata/show_stat_haproxy26.csv").read_text()
    rows = parse_show_stat(text)
    agg = DemandAggregator()
    agg.handle([row_to_metric(r, "lab", T0) for r in rows], T0)
    later = []
    for r in rows:   # 4 s later: near +20 requests (+8 of them 503s), far +100, near now DOWN
        r = dict(r)
        if r["svname"] == "near":
            r.update(hrsp_2xx=str(int(r["hrsp_2xx"]) + 12), hrsp_5xx=str(int(r["hrsp_5xx"]) + 8), status="DOWN")
        elif r["svname"] == "far":
            r.update(hrsp_2xx=str(int(r["hrsp_2xx"]) + 100))
        later.append(row_to_metric(r, "lab", T0 + 4))
    (rec,) = agg.handle(later, T0 + 4)
    assert (rec.edge, rec.backend) == ("lab", "be_web")
    assert rec.demand_rps == pytest.approx(30.0)            # 503s count: they are offered load
    assert rec.origins["near"].rps == pytest.approx(5.0) and rec.origins["near"].up is False
    assert rec.origins["far"].rps == pytest.approx(25.0) and rec.origins["far"].up is True


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=2, max_size=6),
       st.floats(0.5, 30))
def test_demand_equals_sum_of_server_rates(counts, dt) -> None:
    agg = DemandAggregator()
    totals = [0, 0]
    out = []
    for i, (a, b) in enumerate(counts):
        totals = [totals[0] + a, totals[1] + b]
        out = agg.handle([server("e", "be", "s1", totals[0], T0 + i * dt),
                          server("e", "be", "s2", totals[1], T0 + i * dt)], T0 + i * dt)
    a, b = counts[-1]
    assert len(out) == 1 and out[0].demand_rps == pytest.approx((a + b) / dt)
    assert out[0].demand_rps == pytest.approx(sum(o.rps for o in out[0].origins.values()))


def test_sharing_the_workers_rates_gives_the_same_records_as_standalone() -> None:
    """The worker's ``lb`` agent runs lb-rates then edge-demand on one decoded batch (FanOut)."""
    from opsloop.streams.lb.rates import LbRates
    from opsloop.streams.runtime.batch import FanOut

    rates = LbRates()
    shared = DemandAggregator(rates=rates)
    chain = FanOut("lb", [rates, shared])
    alone = DemandAggregator()
    for i, counts in enumerate([(0, 0), (40, 100), (100, 100), (160, 250)]):
        batch = [server("e1", "be", "near", counts[0], T0 + 2 * i), server("e1", "be", "far", counts[1], T0 + 2 * i),
                 server("e2", "be", "near", 7 * i, T0 + 2 * i)]
        chain.handle(batch, T0 + 2 * i)
        want = alone.handle(batch, T0 + 2 * i)
        got = shared.drain()
        alone.drain()
        assert [r.model_dump() for r in got] == [r.model_dump() for r in want]
    assert {r.edge for r in got} == {"e1", "e2"} and got[0].demand_rps > 0


def test_a_silent_server_leaves_the_demand_after_the_ttl() -> None:
    from opsloop.streams.lb.rates import LbRates

    rates = LbRates(ttl_s=10)
    agg = DemandAggregator(rates=rates)
    rates.handle([server("e", "be", "a", 0, T0), server("e", "be", "b", 0, T0)], T0)
    rates.handle([server("e", "be", "a", 10, T0 + 1), server("e", "be", "b", 10, T0 + 1)], T0 + 1)
    assert set(rates.servers("e", "be")) == {"a", "b"}
    for t in range(2, 20):   # only "a" keeps reporting; "b" is removed 10 s after it was last seen
        rates.handle([server("e", "be", "a", 10 + 10 * t, T0 + t)], T0 + t)
        agg.handle([server("e", "be", "a", 10 + 10 * t, T0 + t)], T0 + t)
    assert set(rates.servers("e", "be")) == {"a"}
    (rec,) = agg.drain()[-1:]
    assert set(rec.origins) == {"a"} and rec.demand_rps == pytest.approx(10.0)


def test_server_response_time_rides_along_and_bad_values_are_left_out() -> None:
    """HAProxy's ``rtime`` (ms) is carried per server; a missing or negative one is None."""
    def row(sv: str, count: int, ts: float, rtime: object):
        fields = {"hrsp_2xx": count, "status": "UP"}
        if rtime is not None:
            fields["rtime"] = rtime
        return metric("haproxy", fields, {"host": "e1", "proxy": "be", "sv": sv, "type": "server"}, ts)

    agg = DemandAggregator()
    agg.handle([row("a", 0, T0, 12), row("b", 0, T0, None), row("c", 0, T0, -3)], T0)
    rec = agg.handle([row("a", 10, T0 + 1, 48), row("b", 10, T0 + 1, None), row("c", 10, T0 + 1, -3)],
                     T0 + 1)[0]
    assert rec.origins["a"].rtime_ms == 48.0
    assert rec.origins["b"].rtime_ms is None and rec.origins["c"].rtime_ms is None
    assert EdgeDemand.decode(rec.encode()) == rec
    with pytest.raises(ValueError, match="rtime_ms"):
        EdgeDemand.decode(rec.encode().replace(b'"rtime_ms":48.0', b'"rtime_ms":-1'))


def test_a_rate_beyond_any_edges_is_refused_and_the_next_good_round_is_sent() -> None:
    """A counter that jumps by 1e15 in a second (a corrupt sample) gives no record: counted and
    logged, so the controller's last good record ages into staleness instead of one it must refuse
    (its LP takes no rate above 1e12 req/s). The round after, from good counters, is sent; an
    ``rtime`` beyond 1e9 ms is left out as a negative one is. The record refuses both, naming them."""
    counted = REGISTRY.get_sample_value("opsloop_edge_demand_refused_total") or 0.0
    agg = DemandAggregator()
    agg.handle([server("e1", "be", "a", 0, T0)], T0)
    assert agg.handle([server("e1", "be", "a", 10 ** 15, T0 + 1)], T0 + 1) == []
    assert agg.refused == 1
    assert REGISTRY.get_sample_value("opsloop_edge_demand_refused_total") == counted + 1
    agg.handle([server("e1", "be", "a", 10 ** 15, T0 + 2)], T0 + 2)   # the jump's new base
    (rec,) = agg.handle([server("e1", "be", "a", 10 ** 15 + 30, T0 + 3)], T0 + 3)
    assert rec.demand_rps == pytest.approx(30.0) and agg.refused == 1
    slow = metric("haproxy", {"hrsp_2xx": 10 ** 15 + 60, "hrsp_5xx": 0, "status": "UP", "rtime": 2e9},
                  {"host": "e1", "proxy": "be", "sv": "a", "type": "server"}, T0 + 4)
    (rec,) = agg.handle([slow], T0 + 4)
    assert rec.origins["a"].rtime_ms is None
    with pytest.raises(ValueError, match="demand_rps"):
        EdgeDemand.decode(b'{"edge":"e","backend":"b","demand_rps":1e15,"timestamp":1795000000}')
    with pytest.raises(ValueError, match="rtime_ms"):
        EdgeDemand.decode(rec.encode().replace(b'"rtime_ms":null', b'"rtime_ms":2e9'))
