"""Rows LbRates must not take at face value: a row with an empty proxy tag (refused, named, dead-lettered:
before, its demand record failed validation and cost the batch's good records), a torn row whose counters
are another set than the last one (before: a 100,000 req/s spike and a false LB reset), and a listener
row (show stat type 3: before, taken for a server)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from opsloop.records import metric
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates, count_basis, request_count
from opsloop.streams.runtime.batch import FanOut, decode_and_handle
from opsloop.wire import encode_batch

from tests.helpers import ConsumerMsg

T0 = 1_795_000_000.0


def _row(proxy: str, sv: str, fields: dict, ts: float, typ: str | None = "server", host: str = "e1"):
    tags = {"host": host, "proxy": proxy, "sv": sv}
    if typ is not None:
        tags["type"] = typ
    return metric("haproxy", {**fields, "status": "UP"}, tags, ts)


def _rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("opsloop_lb_samples_rejected_total", {"reason": reason}) or 0.0


def test_an_empty_proxy_row_is_refused_and_the_good_rows_are_sent() -> None:
    rates = LbRates()
    agg = DemandAggregator(rates=rates)
    fan = FanOut("lb", [rates, agg])
    before = _rejected("empty_proxy")
    for i, ts in enumerate((T0, T0 + 10)):
        msgs = [ConsumerMsg("telemetry.lb", 0, 2 * i, b"k", encode_batch([_row("be_web", "a", {"hrsp_2xx": 100 * i}, ts)])),
                ConsumerMsg("telemetry.lb", 0, 2 * i + 1, b"k", encode_batch([_row("", "x", {"hrsp_2xx": 100 * i}, ts)]))]
        batch = decode_and_handle("lb", msgs, fan)
        out = agg.drain()
        # only the bad record is dead-lettered, with its place and why
        assert [(d.offset, "empty or missing proxy tag" in d.reason) for d in batch.deadletters] == [(2 * i + 1, True)]
    assert [(r.backend, r.demand_rps) for r in out] == [("be_web", pytest.approx(10.0))]
    assert rates.rejected == 2 and _rejected("empty_proxy") == before + 2


def test_a_standalone_aggregator_hands_its_rates_refusals_to_the_runtime() -> None:
    agg = DemandAggregator()
    msgs = [ConsumerMsg("telemetry.lb", 0, 5, b"k", encode_batch([_row("", "x", {"hrsp_2xx": 1}, T0)]))]
    (dl,) = decode_and_handle("lb", msgs, agg).deadletters
    assert dl.offset == 5 and "proxy" in dl.reason


def _full(i: int) -> dict:
    # cumulative: a million old 4xx/5xx answers, 100 new 2xx per 10 s round (10 req/s)
    return {"hrsp_2xx": 5000 + 100 * i, "hrsp_4xx": 400_000, "hrsp_5xx": 600_000, "stot": 2000 + 40 * i}


def test_a_torn_row_starts_the_series_afresh_without_a_spike_or_a_reset() -> None:
    resets = REGISTRY.get_sample_value("opsloop_lb_resets_total", {"lb": "torn"}) or 0.0
    rounds = [_full(0), _full(1), {"hrsp_2xx": 5200, "stot": 2080},   # 4xx/5xx columns missing
              _full(3), _full(4), {"stot": 2200},                     # no hrsp column: stot stands in
              _full(6), _full(7)]
    agg = DemandAggregator()
    sent = {}
    for i, f in enumerate(rounds):
        for r in agg.handle([_row("be", "a", f, T0 + 10 * i, host="torn")], T0 + 10 * i):
            sent[i] = r.demand_rps
    assert sent == {1: pytest.approx(10.0), 4: pytest.approx(10.0), 7: pytest.approx(10.0)}
    assert (REGISTRY.get_sample_value("opsloop_lb_resets_total", {"lb": "torn"}) or 0.0) == resets


def test_a_real_reset_of_the_same_counters_is_still_counted() -> None:
    resets = REGISTRY.get_sample_value("opsloop_lb_resets_total", {"lb": "reload"}) or 0.0
    lr = LbRates()
    lr.handle([_row("be", "a", _full(5), T0, host="reload")], T0)
    assert lr.handle([_row("be", "a", _full(0), T0 + 10, host="reload")], T0 + 10) == []
    # counted once the next reading stays below the one before the drop (not a glitch: test_rate_glitch.py)
    (r,) = lr.handle([_row("be", "a", _full(1), T0 + 20, host="reload")], T0 + 20)
    assert r.rate == pytest.approx(10.0)
    assert REGISTRY.get_sample_value("opsloop_lb_resets_total", {"lb": "reload"}) == resets + 1


def test_count_basis_tells_the_counter_sets_apart() -> None:
    full, torn = count_basis(_full(1)), count_basis({"hrsp_2xx": 5100, "stot": 2040})
    assert full is not None and torn is not None and full[1] != torn[1]
    assert count_basis({"stot": 4}) != count_basis({"req_tot": 4})
    assert request_count(_full(1)) == full[0] == 1_005_100


@pytest.mark.parametrize("typ", ["listener", "LISTENER", "unknown"])
def test_listener_rows_are_no_servers(typ: str) -> None:
    agg = DemandAggregator()
    out = []
    for i in range(3):
        out = agg.handle([_row("fe_http", "sock-1", {"hrsp_2xx": 100 * i}, T0 + 10 * i, typ=typ)], T0 + 10 * i)
    assert out == [] and agg.rates.latest == {} and agg.rates.rejected == 0


def test_the_kind_is_inferred_only_without_a_type_tag() -> None:
    lr = LbRates()
    for i in range(2):
        got = lr.handle([_row("be", "a", {"hrsp_2xx": 10 * i}, T0 + i, typ=None),
                         _row("be", "BACKEND", {"hrsp_2xx": 10 * i}, T0 + i, typ=None)], T0 + i)
    assert sorted((r.kind, r.server) for r in got) == [("backend", "BACKEND"), ("server", "a")]


def test_an_unknown_type_is_refused_naming_it() -> None:
    lr = LbRates()
    lr.handle([_row("be", "a", {"hrsp_2xx": 1}, T0, typ="gateway")], T0)
    (f,) = lr.drain_rejected()
    assert "'gateway'" in f.error and lr.latest == {} and lr.drain_rejected() == []
