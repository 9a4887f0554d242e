"""Request rates from HAProxy counters (streams/lb/rates.py), on rows as the HAProxy collector emits them."""

from __future__ import annotations

import pytest

from opsloop.collectors.haproxy.collector import row_to_metric
from opsloop.streams.lb.rates import LbRates, request_count


def test_rates_from_counters_skip_resets_and_duplicates() -> None:
    def sample(count: int, ts: float) -> list:
        return [row_to_metric({"pxname": "be", "svname": "s1", "type": "2", "hrsp_2xx": str(count)}, "lb", ts)]

    lr = LbRates()
    assert lr.handle(sample(100, 1795310400), 0) == []
    (r,) = lr.handle(sample(150, 1795310410), 0)
    assert r.rate == pytest.approx(5.0)
    assert lr.handle(sample(150, 1795310410), 0) == []       # replayed duplicate: ignored
    assert lr.handle(sample(10, 1795310420), 0) == []        # counter reset (reload): no negative rate
    (r,) = lr.handle(sample(30, 1795310430), 0)
    assert r.rate == pytest.approx(2.0)


def test_request_count_accepts_telegraf_field_names() -> None:
    assert request_count({"http_response.2xx": 7, "http_response.5xx": 3, "stot": 1}) == 10
    assert request_count({"stot": 4}) == 4
    assert request_count({"status": "UP"}) is None
