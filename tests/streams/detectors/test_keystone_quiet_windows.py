"""A ``keystone.small_request_p95`` finding whose traffic fell below ``p95_min_requests`` clears after
``QUIET_WINDOWS`` such windows in a row ("too little traffic to measure"), not at the first dip.

Before, a window with fewer than ``p95_min_requests`` small requests neither raised nor cleared: a page opened at
the day's peak stayed open all night (and across restarts) about a p95 nobody could measure any more, while the
frontend went on reporting its quiet rounds. Driven through the real handler and its state as the changelog
carries it (JSON)."""

from __future__ import annotations

import orjson

from opsloop.records import Metric, metric
from opsloop.streams.detectors.keystone.detector import QUIET_WINDOWS, SMALL_P95
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.keystone.settings import KeystoneSettings

T0 = 1_795_300_200.0 - 1_795_300_200.0 % 300   # a window start
HOST = "rgw-1"


def _round(t: float, small: float, p95_ms: float) -> Metric:
    return metric("s3_frontend_requests", {"small_requests": small, "small_p50_ms": p95_ms / 2,
                                           "small_p95_ms": p95_ms}, {"host": HOST}, t)


def _windows(h: KeystoneHandler, first: int, n: int, small: float, p95_ms: float = 800.0) -> float:
    """Rounds every 60 s through windows ``first`` .. ``first + n - 1`` (300 s each); the last round's time."""
    t = T0
    for w in range(first, first + n):
        for i in range(5):
            t = T0 + 300 * w + 60 * i
            h.handle([_round(t, small, p95_ms)], t)
    return t


def _events(h: KeystoneHandler) -> list[str]:
    """Opened/cleared events of the p95 finding since the last call (heartbeats left out)."""
    return [e for e, f in h.drain_outbox() if f.detector == SMALL_P95 and e != "refreshed"]


def _restarted(h: KeystoneHandler) -> KeystoneHandler:
    fresh = KeystoneHandler(h.settings, h.refresh_s)
    fresh.restore({HOST: orjson.loads(orjson.dumps(h.state_of(HOST)))})
    return fresh


def _opened_at_peak() -> KeystoneHandler:
    h = KeystoneHandler(KeystoneSettings(p95_min_requests=20))
    _windows(h, 0, 3, small=200.0)   # 1000 small requests a window at 800 ms
    assert _events(h) == ["opened"]
    return h


def _open(h: KeystoneHandler) -> list[str]:
    return [f.detector for f in h.open_findings() if f.detector == SMALL_P95]


def test_a_p95_finding_clears_after_quiet_windows_in_a_row_with_the_reason() -> None:
    h = _opened_at_peak()
    # the night after: 2 small requests a round, 10 a window (below 20), the frontend still reporting; a window
    # closes at the first round of the next one
    _windows(h, 3, QUIET_WINDOWS, small=2.0)
    assert _events(h) == [] and _open(h) == [SMALL_P95], "fewer quiet windows than QUIET_WINDOWS closed yet"
    _windows(h, 3 + QUIET_WINDOWS, 1, small=2.0)
    (event, done), = [(e, f) for e, f in h.drain_outbox() if f.detector == SMALL_P95]
    assert event == "cleared" and done.cleared and _open(h) == []
    assert "too little traffic" in done.explanation and f"last {QUIET_WINDOWS} windows" in done.explanation
    assert done.last_seen == T0 + 300 * (3 + QUIET_WINDOWS), "at the end of the last quiet window (event time)"


def test_one_quiet_window_between_slow_ones_does_not_flap_the_page() -> None:
    h = _opened_at_peak()
    _windows(h, 3, 1, small=2.0)        # clients backing off the slow Keystone for a window
    _windows(h, 4, 3, small=200.0)      # and back, still slow
    _windows(h, 7, QUIET_WINDOWS, small=2.0)   # closes window 6, slow, and quiet ones fewer than needed
    assert _events(h) == [] and _open(h) == [SMALL_P95]


def test_the_quiet_count_survives_a_restart_and_a_gap_without_rounds_counts() -> None:
    h = _opened_at_peak()
    _windows(h, 3, 2, small=2.0)
    h = _restarted(h)
    _windows(h, 5, 2, small=2.0)
    assert _events(h) == ["cleared"], "one quiet window closed before the restart, two after"
    h = _opened_at_peak()
    # the frontend reported nothing for an hour (the collector restarted), then one quiet round
    t = T0 + 300 * 15
    h.handle([_round(t, 2.0, 800.0)], t)
    h.handle([_round(t + 300, 2.0, 800.0)], t + 300)
    assert _events(h) == ["cleared"]
