"""A request counter that reads low once and then is back (a stats read during a reload, HAProxy nbproc
with its processes answering the stats socket in turn) is a glitch, not a restart.

Before, the low reading was taken for an LB restart and the next good reading made a rate of the whole
counter over one interval: 100 req/s from a server serving 1, sent to the edge controller as demand. Now
the drop is held until the next reading tells the two apart: back at or above the reading before the drop,
a glitch (the rate runs across it from that reading, counted in ``opsloop_lb_glitches_total``); still
below it, a restart (counted in ``opsloop_lb_resets_total``), rated from the low reading as before. A
32-bit wrap reads as a restart (the counter grows again from small values): one interval skipped, no
spike."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from opsloop.records import Metric, metric
from opsloop.streams.edge.demand import DemandAggregator
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import FanOut, decode_and_handle
from opsloop.wire import encode_batch

from tests.helpers import ConsumerMsg

T0 = 1_795_000_000.0
WRAP = 2 ** 32


def _row(count: float, ts: float, lb: str, sv: str = "s1") -> Metric:
    return metric("haproxy", {"hrsp_2xx": count, "hrsp_5xx": 0, "status": "UP"},
                  {"host": lb, "proxy": "be", "sv": sv, "type": "server"}, ts)


def _counts(lb: str) -> tuple[float, float]:
    return (REGISTRY.get_sample_value("opsloop_lb_resets_total", {"lb": lb}) or 0.0,
            REGISTRY.get_sample_value("opsloop_lb_glitches_total", {"lb": lb}) or 0.0)


def _rates(counts: list[float], lb: str, step: float = 10.0) -> dict[int, float]:
    """Feed one server's readings a round apart; the rate each round gave (by round)."""
    lr = LbRates()
    out = {}
    for i, c in enumerate(counts):
        for r in lr.handle([_row(c, T0 + step * i, lb)], T0 + step * i):
            out[i] = r.rate
    return out


@pytest.mark.parametrize("low", [0, 400])   # a zero read, or another process's smaller counter
def test_a_counter_low_once_then_back_is_rated_across_not_a_spike(low: float) -> None:
    lb = f"glitch-{low}"
    before = _counts(lb)
    got = _rates([1000, 1010, low, 1030, 1040], lb)
    # the round after the glitch: (1030 - 1010) / 20 s, not (1030 - low) / 10 s
    assert got == {1: pytest.approx(1.0), 3: pytest.approx(1.0), 4: pytest.approx(1.0)}
    resets, glitches = _counts(lb)
    assert (resets, glitches) == (before[0], before[1] + 1)


def test_a_true_restart_still_starts_from_the_low_reading_and_is_counted() -> None:
    lb = "restart-true"
    before = _counts(lb)
    got = _rates([1000, 1010, 0, 5, 15], lb)
    assert got == {1: pytest.approx(1.0), 3: pytest.approx(0.5), 4: pytest.approx(1.0)}
    assert _counts(lb) == (before[0] + 1, before[1])


def test_a_32_bit_wrap_reads_as_a_restart_without_a_spike() -> None:
    lb = "wrap32"
    before = _counts(lb)
    # 100 req/s across the wrap: 2^32 - 1500, 2^32 - 500, then 500, 1500 (mod 2^32)
    got = _rates([WRAP - 1500, WRAP - 500, 500, 1500], lb)
    assert got == {1: pytest.approx(100.0), 3: pytest.approx(100.0)}
    assert _counts(lb) == (before[0] + 1, before[1])


def test_processes_answering_in_turn_give_no_spikes() -> None:
    """nbproc: readings alternate between a busy process (1000, 1010, ...) and a quiet one (200, 201, ...)."""
    counts = [1000 + 10 * (i // 2) if i % 2 == 0 else 200 + i // 2 for i in range(10)]
    got = _rates(counts, "alternating")
    assert got and max(got.values()) <= 1.0 + 1e-9, got


def test_two_drops_in_a_row_then_back_is_one_glitch() -> None:
    lb = "double-drop"
    before = _counts(lb)
    got = _rates([1000, 1010, 300, 0, 1040], lb)
    assert got == {1: pytest.approx(1.0), 4: pytest.approx(1.0)}   # (1040 - 1010) / 30 s
    assert _counts(lb) == (before[0], before[1] + 1)


def test_a_drop_then_a_torn_row_is_counted_a_reset_and_the_series_starts_afresh() -> None:
    lb = "drop-torn"
    before = _counts(lb)
    lr = LbRates()
    for i, c in enumerate([1000, 1010, 0]):
        lr.handle([_row(c, T0 + 10 * i, lb)], T0 + 10 * i)
    torn = metric("haproxy", {"hrsp_2xx": 1030, "status": "UP"}, {"host": lb, "proxy": "be", "sv": "s1",
                                                                  "type": "server"}, T0 + 30)
    assert lr.handle([torn], T0 + 30) == []
    assert _counts(lb) == (before[0] + 1, before[1])
    assert lr.handle([_row(1040, T0 + 40, lb)], T0 + 40) == []   # basis back: starts afresh again


def test_the_edge_demand_shows_no_spike_after_a_glitch() -> None:
    """The worker's pair of handlers on records: the glitch round sends no record of 100x the demand."""
    rates = LbRates()
    agg = DemandAggregator(rates=rates)
    fan = FanOut("lb", [rates, agg])
    sent = []
    for i, (a, b) in enumerate([(5000, 9000), (5100, 9200), (0, 9400), (5300, 9600), (5400, 9800)]):
        ts = T0 + 10 * i
        msg = ConsumerMsg("telemetry.lb", 0, i, b"k", encode_batch([_row(a, ts, "edge-g", "a"),
                                                                   _row(b, ts, "edge-g", "b")]))
        batch = decode_and_handle("lb", [msg], fan, max_clock_skew_s=1e12)
        assert batch.deadletters == []
        sent += agg.drain()
    assert sent
    for rec in sent:
        assert rec.demand_rps <= 30.0 + 1e-9, rec   # 10 + 20 req/s at most
        assert all(o.rps <= 20.0 + 1e-9 for o in rec.origins.values()), rec


def test_a_drop_the_series_never_tells_apart_is_counted_a_reset_when_it_expires() -> None:
    lb = "drop-expired"
    before = _counts(lb)
    lr = LbRates(ttl_s=60.0)
    for i, c in enumerate([1000, 1010, 0]):
        lr.handle([_row(c, T0 + 10 * i, lb)], T0 + 10 * i)
    assert _counts(lb) == before
    lr.handle([], T0 + 200)   # silent beyond the TTL: forgotten
    assert lr.latest == {} and _counts(lb) == (before[0] + 1, before[1])
