"""Which servers a demand record holds and what it says of them: a record that cannot be built costs only
itself; a server's status is found under the key its rate has (long tags shortened, an untyped row a server)
and goes with its series; a removed server leaves the sum within two collection rounds (not series_ttl_s);
a huge status is cut so the record stays sendable."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from opsloop.records import EdgeDemand, OriginState, metric
from opsloop.records.edge import MAX_STATUS_CHARS
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates

T0 = 1_795_000_000.0


def _row(sv: str, n: float, ts: float, status: str = "UP", typed: bool = True, proxy: str = "be",
         rtime: float | None = None):
    tags = {"host": "e1", "proxy": proxy, "sv": sv}
    if typed:
        tags["type"] = "server"
    fields: dict = {"hrsp_2xx": n, "status": status}
    if rtime is not None:
        fields["rtime"] = rtime
    return metric("haproxy", fields, tags, ts)


def test_a_record_that_cannot_be_built_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    agg = DemandAggregator()
    build = agg._record

    def record(lb: str, backend: str):
        if backend == "be_bad":
            raise ValueError("1 validation error for EdgeDemand")
        return build(lb, backend)

    monkeypatch.setattr(agg, "_record", record)
    counted = REGISTRY.get_sample_value("opsloop_edge_demand_invalid_total") or 0.0
    for i in range(2):
        out = agg.handle([_row("a", 100 * i, T0 + 10 * i, proxy="be_bad"),
                          _row("a", 100 * i, T0 + 10 * i, proxy="be_good")], T0 + 10 * i)
    assert [(r.backend, r.demand_rps) for r in out] == [("be_good", pytest.approx(10.0))]
    assert agg.invalid == 1 and REGISTRY.get_sample_value("opsloop_edge_demand_invalid_total") == counted + 1


@pytest.mark.parametrize("sv,typed", [("s" * 300, True), ("a", False)])
def test_a_down_server_is_reported_down_whatever_its_tags(sv: str, typed: bool) -> None:
    agg = DemandAggregator()
    agg.handle([_row(sv, 0, T0, "DOWN", typed, rtime=40)], T0)
    (rec,) = agg.handle([_row(sv, 50, T0 + 10, "DOWN", typed, rtime=40)], T0 + 10)
    (o,) = rec.origins.values()
    assert (o.status, o.up, o.rtime_ms) == ("DOWN", False, 40.0)


def test_the_status_of_a_dropped_long_named_server_goes_with_it() -> None:
    rates = LbRates(ttl_s=10)
    agg = DemandAggregator(rates=rates)
    for i in range(5):
        m = [_row(f"{i}-" + "s" * 10_000, 0, T0 + i, rtime=5)]
        rates.handle(m, T0 + i)
        agg.handle(m, T0 + i)
    assert len(agg.status) == 5 and max(len(k[2]) for k in agg.status) < 1000   # the shortened keys
    rates.handle([], T0 + 100)
    agg.handle([], T0 + 100)
    assert agg.status == {} and agg.rtime == {}


def _removal(interval: float) -> list[tuple[float, set[str]]]:
    """a and b share 100 req/s; b is removed at round 3 and a takes all of it."""
    agg = DemandAggregator(ttl_s=interval * 20)
    a = b = 0.0
    got = []
    for i in range(10):
        ts = T0 + interval * i
        if i < 3:
            rows = [_row("a", a, ts), _row("b", b, ts)]
            a += 50 * interval
            b += 50 * interval
        else:
            rows = [_row("a", a, ts)]
            a += 100 * interval
        got += [(r.demand_rps, set(r.origins)) for r in agg.handle(rows, ts)]
    return got


@pytest.mark.parametrize("interval", [10.0, 60.0])
def test_a_removed_server_leaves_the_sum_within_two_rounds(interval: float) -> None:
    got = _removal(interval)
    # rounds 1..9: b's last rate still counts the round it is first missing (one missed round is
    # tolerated), then it is gone: before, 150 req/s were reported until series_ttl_s
    assert got[2] == (pytest.approx(100.0), {"a", "b"})
    assert got[3:] == [(pytest.approx(100.0), {"a"})] * 6


def test_a_server_missing_one_round_stays_in_the_sum() -> None:
    agg = DemandAggregator()
    out = []
    for i in range(5):
        ts = T0 + 10 * i
        rows = [_row("a", 500 * i, ts)] + ([] if i == 3 else [_row("b", 500 * i, ts)])
        out.append(agg.handle(rows, ts))
    assert set(out[3][0].origins) == {"a", "b"}
    assert out[4][0].demand_rps == pytest.approx(100.0)


def test_a_huge_status_is_cut_and_the_record_stays_small() -> None:
    agg = DemandAggregator()
    for i in range(2):
        out = agg.handle([_row("a", 100 * i, T0 + 10 * i), _row("b", 100 * i, T0 + 10 * i, "DOWN" + " " * 1_000_000),
                          _row("c", 100 * i, T0 + 10 * i, " " * 1_000_000 + "MAINT")], T0 + 10 * i)
    (rec,) = out
    assert len(rec.encode()) < 2000
    assert (rec.origins["b"].status, rec.origins["b"].up) == ("DOWN", False)
    assert (rec.origins["c"].status, rec.origins["c"].up) == ("MAINT", False)
    assert EdgeDemand.decode(rec.encode()) == rec


def test_the_record_refuses_a_status_beyond_its_bound_naming_it() -> None:
    OriginState(rps=1.0, status="x" * MAX_STATUS_CHARS)
    with pytest.raises(ValueError, match="status"):
        OriginState(rps=1.0, status="x" * (MAX_STATUS_CHARS + 1))
    with pytest.raises(ValueError, match="status"):
        EdgeDemand.decode(b'{"edge":"e","backend":"b","demand_rps":1,"timestamp":1795000000,'
                          b'"origins":{"a":{"rps":1,"status":"' + b"x" * 1000 + b'"}}}')
