"""The small-request p95 gauges through quiet rounds and windows: no sample, not the last busy value.

Before, ``opsloop_keystone_small_request_p95_seconds`` (last round) and ``..._window_seconds`` (last closed window)
kept the last busy round's and window's p95 for as long as traffic stayed away: a page's 750 ms all night, or a
healthy 100 ms through an outage of the front end's clients. A quiet round or window now has no sample (0 would
read fast, NaN breaks every comparison), and the detector neither raises nor clears on it."""

from __future__ import annotations

import orjson
from prometheus_client import REGISTRY

from opsloop.records import Metric, metric
from opsloop.streams.detectors.keystone.detector import SMALL_P95
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.keystone.settings import KeystoneSettings
from tests.helpers import unique

T0 = 1_795_300_200.0 - 1_795_300_200.0 % 300   # a window start


def _round(host: str, t: float, small: float, p95_ms: float = 800.0) -> Metric:
    fields = {"requests": small, "small_requests": small}
    if small:   # what the collector sends: a round without small requests has no latency fields
        fields |= {"small_p50_ms": p95_ms / 2, "small_p95_ms": p95_ms}
    return metric("s3_frontend_requests", fields, {"host": host}, t)


def _gauges(host: str) -> tuple[float | None, float | None]:
    """(last round, last window) in seconds, to 2 decimals (the window's is a histogram's, ~1 % off)."""
    values = (REGISTRY.get_sample_value("opsloop_keystone_small_request_p95_seconds", {"host": host}),
              REGISTRY.get_sample_value("opsloop_keystone_small_request_p95_window_seconds", {"host": host}))
    return tuple(None if v is None else round(v, 2) for v in values)  # type: ignore[return-value]


def _window(h: KeystoneHandler, host: str, w: int, small: float, p95_ms: float = 800.0) -> None:
    for i in range(5):
        t = T0 + 300 * w + 60 * i
        h.handle([_round(host, t, small, p95_ms)], t)


def test_quiet_rounds_and_windows_have_no_p95_sample_and_busy_ones_show_it_again() -> None:
    host = unique("ks-quiet")
    h = KeystoneHandler(KeystoneSettings(p95_min_requests=20))
    for w in range(3):
        _window(h, host, w, small=200.0)
    assert _gauges(host) == (0.8, 0.8)
    assert [f.detector for f in h.open_findings()] == [SMALL_P95]
    t = T0 + 300 * 3
    h.handle([_round(host, t, 0.0)], t)   # the first round of window 3 closes window 2 (busy): no request in it
    assert _gauges(host) == (None, 0.8), "before: the last round's 0.8 s stayed"
    _window(h, host, 3, small=0.0)
    t = T0 + 300 * 4
    h.handle([_round(host, t, 0.0)], t)   # closes window 3, which had no small request
    assert _gauges(host) == (None, None), "before: the last busy window's 0.8 s stayed"
    assert [f.detector for f in h.open_findings()] == [SMALL_P95], "one quiet window neither clears nor raises"
    h.handle([_round(host, t + 60, 2.0)], t + 60)   # a trickle: measured per round, the window still quiet
    assert _gauges(host) == (0.8, None)
    # restarted on a quiet last window: still no window sample
    fresh = KeystoneHandler(h.settings, h.refresh_s)
    fresh.restore({host: orjson.loads(orjson.dumps(h.state_of(host)))})
    assert _gauges(host)[1] is None
    _window(fresh, host, 5, small=200.0, p95_ms=100.0)
    t = T0 + 300 * 6
    fresh.handle([_round(host, t, 200.0, 100.0)], t)
    assert _gauges(host) == (0.1, 0.1)
    assert fresh.open_findings() == []
