"""LB rates under the timing a real edge's collectors produce: an HA pair of collectors reading the same load
balancer, a collector whose clock steps back, a gap of many rounds, and counters too large to be counts.

Before: the second collector of an HA pair, reading the same round milliseconds after the first, made a rate of a
few requests over a few milliseconds of stamps (the stamps' jitter, not the traffic: 10x the demand, every round);
a collector clock stepped back 30 s left the series silent until it caught up, then one rate of the step's
traffic over one round (4x); a row whose counters summed past the largest float (1e308 + 1e308 = inf) gave a NaN
rate and its server left the demand's sum, unsaid. Now the same round read twice is skipped, a step back goes on
from the newer reading, and a counter beyond 2^64 (HAProxy's are unsigned 64-bit) is refused and dead-lettered;
each counted."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from opsloop.records import EdgeDemand, Metric, metric
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import FanOut, decode_and_handle
from opsloop.wire import encode_batch

from tests.helpers import ConsumerMsg

T0 = 1_795_000_000.0
ROUND = 10.0


def _row(lb: str, sv: str, count: float, ts: float, hrsp_5xx: float = 0) -> Metric:
    return metric("haproxy", {"hrsp_2xx": count, "hrsp_5xx": hrsp_5xx, "status": "UP"},
                  {"host": lb, "proxy": "be", "sv": sv, "type": "server"}, ts)


def _out_of_step(lb: str, reason: str) -> float:
    return REGISTRY.get_sample_value("opsloop_lb_out_of_step_samples_total", {"lb": lb, "reason": reason}) or 0.0


class Lb:
    """The worker's pair of handlers, fed encoded records as the lb agent gets them from telemetry.lb."""

    def __init__(self) -> None:
        self.rates = LbRates()
        self.demand = DemandAggregator(rates=self.rates)
        self.fan = FanOut("lb", [self.rates, self.demand])
        self.offset = 0

    def send(self, rows: list[Metric]) -> tuple[list[EdgeDemand], list]:
        msg = ConsumerMsg("telemetry.lb", 0, self.offset, b"k", encode_batch(rows))
        self.offset += 1
        batch = decode_and_handle("lb", [msg], self.fan, max_clock_skew_s=1e12)
        return self.demand.drain(), batch.deadletters


@pytest.mark.parametrize("offset", [0.05, -0.03])   # the second collector reads later; or its clock is behind
def test_an_ha_pair_reading_the_same_round_gives_the_true_demand(offset: float) -> None:
    lb = f"ha-pair{offset}"
    before = _out_of_step(lb, "same_round")
    edge = Lb()
    sent: list[EdgeDemand] = []
    for i in range(6):
        real = ROUND * i
        # 100 req/s on each server; each collector stamps its own read (the second reads 50 ms later; its stamp
        # is off by a few ms of latency, or its clock is 30 ms behind)
        for read_at, stamp in ((real, real), (real + 0.05, real + offset + 0.005)):
            recs, dead = edge.send([_row(lb, sv, 100 * read_at, T0 + stamp) for sv in ("a", "b")])
            assert dead == []
            sent += recs
    assert len(sent) == 5
    for rec in sent:
        assert rec.demand_rps == pytest.approx(200.0, rel=1e-3), rec
        assert all(o.rps == pytest.approx(100.0, rel=1e-3) for o in rec.origins.values()), rec
    assert _out_of_step(lb, "same_round") == before + 2 * 6


def test_an_ha_pair_reading_half_a_round_apart_rates_every_round_honestly() -> None:
    """Unaligned collectors of the same LB sample it twice a round: each reading rated, each rate the true one."""
    lb = "ha-unaligned"
    edge = Lb()
    rates = []
    for i in range(8):
        t = ROUND / 2 * i
        recs, _ = edge.send([_row(lb, "a", 100 * t, T0 + t)])
        rates += [r.demand_rps for r in recs]
    assert rates == [pytest.approx(100.0)] * 7
    assert _out_of_step(lb, "same_round") == 0


def test_a_collector_clock_stepped_back_gives_no_spike() -> None:
    lb = "clock-back"
    edge = Lb()
    got = {}
    for i in range(9):
        real = ROUND * i
        stamp = real - (30.0 if i >= 3 else 0.0)   # NTP steps the collector's clock back 30 s before round 3
        recs, dead = edge.send([_row(lb, "a", 10 * real, T0 + stamp)])
        assert dead == []
        got.update({i: r.demand_rps for r in recs})
    # round 3 restarts the series from its reading: every later round the true 10 req/s (before: nothing for
    # rounds 3..5, then 40 req/s at round 6, the 30 s step's traffic over one round)
    assert got == {i: pytest.approx(10.0) for i in (1, 2, 4, 5, 6, 7, 8)}
    assert _out_of_step(lb, "clock_back") == 1


def test_an_older_round_replayed_after_a_newer_one_changes_nothing() -> None:
    """A collector's spool replayed after an outage: an old round after a newer one is no news, not a step back."""
    lb = "replayed"
    edge = Lb()
    for i in range(3):
        edge.send([_row(lb, "a", 10 * ROUND * i, T0 + ROUND * i)])
    recs, dead = edge.send([_row(lb, "a", 10 * ROUND, T0 + ROUND)])   # round 1 again
    assert recs == [] and dead == []
    (rec,), _ = edge.send([_row(lb, "a", 30 * ROUND, T0 + 3 * ROUND)])
    assert rec.demand_rps == pytest.approx(10.0)
    assert _out_of_step(lb, "clock_back") == 0


def test_a_gap_of_many_rounds_is_spread_over_the_gap() -> None:
    lb = "gap"
    edge = Lb()
    edge.send([_row(lb, "a", 0, T0)])
    (rec,), _ = edge.send([_row(lb, "a", 50, T0 + ROUND)])
    assert rec.demand_rps == pytest.approx(5.0)
    # the collector away for 9 rounds (inside series_ttl_s): 450 requests over 90 s, not over one round
    (rec,), _ = edge.send([_row(lb, "a", 500, T0 + 10 * ROUND)])
    assert rec.demand_rps == pytest.approx(5.0) and rec.timestamp == T0 + 10 * ROUND
    for i in range(11, 15):   # and the rounds after it are rounds again, each rated (none "the same round")
        (rec,), _ = edge.send([_row(lb, "a", 50 * i, T0 + i * ROUND)])
        assert rec.demand_rps == pytest.approx(5.0)
    assert _out_of_step(lb, "same_round") == 0


def test_counters_beyond_any_count_are_refused_and_the_server_stays_in_the_demand() -> None:
    lb = "huge"
    edge = Lb()
    rejected = REGISTRY.get_sample_value("opsloop_lb_samples_rejected_total", {"reason": "bad_counter"}) or 0.0
    sent = []
    for i, (a, a5) in enumerate([(0, 0), (10, 0), (1e308, 1e308), (2.0 ** 64 * 2, 0), (40, 0)]):
        ts = T0 + ROUND * i
        recs, dead = edge.send([_row(lb, "a", a, ts, a5), _row(lb, "b", ROUND * i, ts)])
        assert len(dead) == (1 if i in (2, 3) else 0)
        sent += recs
    # rounds 2 and 3: a's rows refused (dead-lettered); before, round 2 summed to inf, a's rate was NaN and the
    # record left a out unsaid (1 req/s of 2). a keeps its last rate one missed round, then is left out.
    assert [(r.demand_rps, sorted(r.origins)) for r in sent] == [
        (pytest.approx(2.0), ["a", "b"]), (pytest.approx(2.0), ["a", "b"]), (pytest.approx(1.0), ["b"]),
        (pytest.approx(2.0), ["a", "b"])]
    assert REGISTRY.get_sample_value("opsloop_lb_samples_rejected_total", {"reason": "bad_counter"}) == rejected + 2
